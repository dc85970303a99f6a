//! Every command line in the docs' shell blocks parses with the parser of the binary it runs, so
//! that a README command that would fail as written fails CI instead; and the binaries' help
//! stays readable: a short summary per subcommand, no source paths.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every Markdown file of the repository (build outputs and hidden directories aside).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "out" {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, out);
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// One command line of a shell block: where it is, and its text with continuations joined.
struct Line {
    at: String,
    text: String,
}

/// The lines of the ```sh / ```bash / ```shell / ```console blocks of `text`.
fn shell_lines(file: &str, text: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut shell = None::<bool>;
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            shell = match shell {
                None => Some(matches!(lang.trim(), "sh" | "bash" | "shell" | "console")),
                Some(_) => None,
            };
            continue;
        }
        if shell != Some(true) {
            continue;
        }
        if pending.is_empty() {
            start = i + 1;
        }
        match raw.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(raw);
                lines.push(Line { at: format!("{file}:{start}"), text: std::mem::take(&mut pending) });
            }
        }
    }
    lines
}

/// Shell words of one line, quotes removed and `$(...)` kept whole inside its word; a `#` that
/// starts a word ends the line. Operators (`|`, `;`, `&&`, `>`, `2>&1`...) are words of their own.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                in_word = true;
                let mut depth = 0;
                word.push('$');
                for q in chars.by_ref() {
                    word.push(q);
                    depth += match q {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '|' | ';' | '&' | '>' | '<' => {
                if in_word && !word.chars().all(|d| d.is_ascii_digit()) {
                    out.push(std::mem::take(&mut word));
                }
                word.clear();
                in_word = false;
                out.push(c.to_string());
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The binaries whose parsers are checked, by the name a doc runs them as.
const BINARIES: [&str; 5] = ["agent", "ctl", "analyze", "testbeds", "bench"];

/// The rocemesh binary each simple command of `words` runs, with its arguments (redirections
/// dropped); `cargo run ... -p rocemesh-X -- ARGS` runs X.
fn invocations(words: &[String]) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for cmd in words.split(|w| matches!(w.as_str(), "|" | ";" | "&")) {
        // Redirections: an operator and the word after it.
        let mut args = Vec::new();
        let mut skip = false;
        for w in cmd {
            if skip {
                skip = false;
            } else if w == ">" || w == "<" {
                skip = true;
            } else {
                args.push(w.clone());
            }
        }
        let mut at = 0;
        while at < args.len()
            && (args[at].contains('=') || matches!(args[at].as_str(), "sudo" | "/usr/bin/time" | "time"))
        {
            at += 1;
        }
        let Some(first) = args.get(at) else { continue };
        if first == "cargo" && args.get(at + 1).is_some_and(|w| w == "run") {
            let package = args.windows(2).find(|p| p[0] == "-p").map(|p| p[1].clone());
            let dashes = args.iter().position(|w| w == "--");
            if let (Some(package), Some(dashes)) = (package, dashes)
                && let Some(bin) = BINARIES.iter().find(|b| package == format!("rocemesh-{b}"))
            {
                out.push((*bin, args[dashes + 1..].to_vec()));
            }
            continue;
        }
        let name = first.rsplit('/').next().unwrap_or(first);
        let name = name.strip_prefix("rocemesh-").unwrap_or(name);
        if let Some(bin) = BINARIES.iter().find(|b| **b == name) {
            out.push((*bin, args[at + 1..].to_vec()));
        }
    }
    out
}

fn parse(bin: &str, args: &[String]) -> Result<(), String> {
    let argv = std::iter::once(bin.to_owned()).chain(args.iter().cloned());
    let r = match bin {
        "agent" => rocemesh_agent::cli::Cli::try_parse_from(argv).map(drop),
        "ctl" => rocemesh_ctl::cli::Cli::try_parse_from(argv).map(drop),
        "analyze" => rocemesh_analyze::cli::Cli::try_parse_from(argv).map(drop),
        "testbeds" => rocemesh_testbeds::cli::Cli::try_parse_from(argv).map(drop),
        "bench" => rocemesh_bench::cli::Cli::try_parse_from(argv).map(drop),
        other => unreachable!("{other} is not in BINARIES"),
    };
    r.map_err(|e| e.render().to_string())
}

#[test]
fn every_command_line_in_the_docs_parses() {
    let root = repo();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    let mut parsed = std::collections::BTreeMap::<&str, usize>::new();
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        for line in shell_lines(&name, &text) {
            for (bin, args) in invocations(&words(&line.text)) {
                *parsed.entry(bin).or_default() += 1;
                if let Err(e) = parse(bin, &args) {
                    failures.push(format!("{}: `{}`:\n{e}", line.at, line.text.trim()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "command lines the binaries refuse:\n\n{}", failures.join("\n"));
    // The docs run every binary; a walk that found none of them checked nothing.
    for bin in ["agent", "ctl", "analyze", "testbeds", "bench"] {
        assert!(
            parsed.get(bin).is_some_and(|n| *n > 0),
            "no `{bin}` command found in {} files: {parsed:?}",
            files.len()
        );
    }
    assert!(parsed.values().sum::<usize>() >= 30, "too few command lines found: {parsed:?}");
}

#[test]
fn the_shell_line_reader_finds_what_a_shell_would_run() {
    let w = words(r#"sudo rocemesh-agent describe --config /etc/a.toml > "$(hostname).toml" # note"#);
    assert_eq!(w, ["sudo", "rocemesh-agent", "describe", "--config", "/etc/a.toml", ">", "$(hostname).toml"]);
    let inv = invocations(&w);
    assert_eq!(inv, [("agent", vec!["describe".to_owned(), "--config".to_owned(), "/etc/a.toml".to_owned()])]);
    let w = words(r#"$B/analyze report /data/"$(date -u +%F)"/ 2>&1 | tee log"#);
    assert_eq!(invocations(&w), [("analyze", vec!["report".to_owned(), "/data/$(date -u +%F)/".to_owned()])]);
    let w = words("cargo run --release -p rocemesh-bench -- analyze --sealed");
    assert_eq!(invocations(&w), [("bench", vec!["analyze".to_owned(), "--sealed".to_owned()])]);
    assert!(invocations(&words("journalctl -u rocemesh-agent -f")).is_empty());
    // And a command a binary refuses is caught: the README's old gen-pinglists without --seed.
    let old = words("rocemesh-ctl gen-pinglists --inventory inventory.toml --out pinglists/");
    let (bin, args) = &invocations(&old)[0];
    assert!(parse(bin, args).is_err_and(|e| e.contains("--seed")));
}

/// Every subcommand, its path from the binary's name.
fn commands(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let p = format!("{path} {}", sub.get_name());
        commands(sub, p.clone(), out);
        out.push((p, sub.clone()));
    }
}

#[test]
fn help_is_a_short_summary_per_command_and_names_no_source_file() {
    let mut all = Vec::new();
    for (name, cmd) in [
        ("agent", rocemesh_agent::cli::Cli::command()),
        ("ctl", rocemesh_ctl::cli::Cli::command()),
        ("analyze", rocemesh_analyze::cli::Cli::command()),
        ("testbeds", rocemesh_testbeds::cli::Cli::command()),
        ("bench", rocemesh_bench::cli::Cli::command()),
    ] {
        commands(&cmd, name.to_owned(), &mut all);
        all.push((name.to_owned(), cmd));
    }
    let mut problems = Vec::new();
    for (path, cmd) in &all {
        let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
        // `-h` lists subcommands by this line: a summary, the detail under `--help`. (A binary's
        // own is its package description.)
        if path.contains(' ') && (about.is_empty() || about.chars().count() > 100) {
            problems.push(format!("{path}: summary of {} characters (1 to 100): {about}", about.chars().count()));
        }
        let mut texts = vec![about, cmd.get_long_about().map(|a| a.to_string()).unwrap_or_default()];
        for arg in cmd.get_arguments() {
            texts.extend(arg.get_help().map(|h| h.to_string()));
            texts.extend(arg.get_long_help().map(|h| h.to_string()));
        }
        for t in texts.iter().filter(|t| cites_source(t)) {
            problems.push(format!("{path}: help cites a source file: {t}"));
        }
    }
    assert!(all.len() > 30, "too few commands walked: {}", all.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `foo.rs` or `src/` in a help text (`*.rseg` is a segment file, not a source).
fn cites_source(text: &str) -> bool {
    text.contains("src/")
        || text.match_indices(".rs").any(|(i, _)| !text[i + 3..].starts_with(|c: char| c.is_alphanumeric()))
}
