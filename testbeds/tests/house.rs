//! The repository's shape, checked: every link and file reference in the docs resolves, no
//! module's imports go round in a circle, no source file outgrows one reading, and the front
//! documents stay within the sizes that keep them read.
//!
//! The module graph: each crate root (`lib.rs`, `main.rs`) and the `mod x;` declarations under it
//! give the module tree. A module refers to another by a path (`crate::a::b`, `super::c`, a child
//! `d::`) in its non-test code. A reference from a module to one that is not its ancestor or
//! descendant is lifted to the two siblings under their lowest common ancestor (`localize::blame`
//! using `ingest::Dataset` is `localize` -> `ingest`); among the children of every module those
//! edges must not form a circle. Parent and child may refer to each other: that is Rust's
//! module tree, not a circle of seams.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn walk(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') && name != ".ci" || name == "target" || name == "corpus" || name == "node_modules" {
            continue;
        }
        if p.is_dir() {
            walk(&p, keep, out);
        } else if keep(&p) {
            out.push(p);
        }
    }
}

/// Every markdown file of the repository.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(root, &|p| p.extension().is_some_and(|e| e == "md"), &mut out);
    out
}

/// GitHub's anchor for a heading: lowercase, spaces to hyphens, other punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> HashSet<String> {
    let mut fenced = false;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = HashSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let s = slug(line.trim_start_matches('#').replace('`', "").as_str());
        let n = seen.entry(s.clone()).or_default();
        out.insert(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
        *n += 1;
    }
    out
}

/// The markdown links `[text](target)` of a text, outside code fences and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let unspanned: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for rest in unspanned.split("](").skip(1) {
            if let Some(target) = rest.split(')').next() {
                out.push((i + 1, target.trim().to_string()));
            }
        }
    }
    out
}

/// The top-level directories and files a backticked repository path may start with.
fn tracked_roots(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .expect("the repository root")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "target" && (!n.starts_with('.') || n == ".ci"))
        .collect()
}

/// Code spans that name a file in the repository: `dir/file.ext` or `dir/sub/`, starting at a
/// top-level entry; globs, placeholders and options are not references.
fn path_spans(text: &str, roots: &BTreeSet<String>) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for span in line.split('`').skip(1).step_by(2) {
            let span = span.trim();
            let Some(first) = span.split('/').next() else { continue };
            if !span.contains('/') || !roots.contains(first) || span.contains(' ') {
                continue;
            }
            if span.contains(['*', '<', '>', '{', '$', '=', ':', '[']) || span.contains("...") {
                continue;
            }
            out.push((i + 1, span.trim_end_matches('.').to_string()));
        }
    }
    out
}

#[test]
fn every_link_anchor_and_file_reference_in_the_docs_resolves() {
    let root = repo();
    let roots = tracked_roots(&root);
    let files = markdown_files(&root);
    assert!(files.len() >= 10, "found too few markdown files to mean anything: {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file);
        let dir = file.parent().expect("a file has a directory");
        let shown = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() { file.clone() } else { dir.join(path) };
            if !resolved.exists() {
                broken.push(format!("{shown}:{line}: link {target}: no such file"));
                continue;
            }
            if !anchor.is_empty()
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&resolved)).contains(anchor)
            {
                broken.push(format!("{shown}:{line}: link {target}: no heading with that anchor"));
            }
        }
        for (line, path) in path_spans(&text, &roots) {
            if !root.join(&path).exists() {
                broken.push(format!("{shown}:{line}: `{path}` does not exist"));
            }
        }
    }
    assert!(broken.is_empty(), "broken references:\n{}", broken.join("\n"));
}

/// Code that cites a document by section (a file name followed by `#anchor`, or by a comma and
/// the heading in quotes) cites one that exists.
#[test]
fn code_cites_documents_and_sections_that_exist() {
    let root = repo();
    let mut files = Vec::new();
    walk(
        &root,
        &|p| {
            p.extension().is_some_and(|e| e == "rs" || e == "toml" || e == "py") || p.starts_with(root.join("scripts"))
        },
        &mut files,
    );
    assert!(files.len() > 50, "found too few source files to mean anything: {}", files.len());
    let mut broken = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let shown = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        for (i, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices(".md") {
                let start =
                    line[..at].rfind(|c: char| !(c.is_alphanumeric() || "/_.-".contains(c))).map_or(0, |s| s + 1);
                let name = &line[start..at + 3];
                if name.len() <= 3 || name.starts_with('.') {
                    continue;
                }
                // Names relative to the repository root, or the bare front documents.
                let path = root.join(name);
                if !path.exists() {
                    if name.contains('/') || ["ARCHITECTURE.md", "README.md"].contains(&name) {
                        broken.push(format!("{shown}:{}: cites {name}, which does not exist", i + 1));
                    }
                    continue;
                }
                let rest = &line[at + 3..];
                let section = if let Some(anchor) = rest.strip_prefix('#') {
                    Some(
                        anchor
                            .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
                            .next()
                            .unwrap_or("")
                            .to_string(),
                    )
                } else {
                    rest.strip_prefix(", \"")
                        .or_else(|| rest.strip_prefix(" (\""))
                        .and_then(|s| s.split_once('"'))
                        .map(|(heading, _)| slug(heading))
                };
                if let Some(anchor) = section.filter(|a| !a.is_empty())
                    && !anchors(&read(&path)).contains(&anchor)
                {
                    broken.push(format!("{shown}:{}: cites {name}#{anchor}, which has no such heading", i + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "stale citations:\n{}", broken.join("\n"));
}

#[test]
fn the_front_documents_stay_short() {
    let root = repo();
    for (name, max_bytes) in [("README.md", 10_000), ("ARCHITECTURE.md", 30_000)] {
        let len = read(&root.join(name)).len();
        assert!(len <= max_bytes, "{name} is {len} bytes, over {max_bytes}: move depth into docs/");
    }
    let arch = read(&root.join("ARCHITECTURE.md"));
    assert!(anchors(&arch).contains("the-life-of-a-probe"), "ARCHITECTURE.md has no \"The life of a probe\"");
}

/// The lines of a Rust file outside its test module (`#[cfg(test)] mod tests`), blank lines and
/// comments left out.
fn code_lines(text: &str) -> usize {
    let body = text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at]);
    body.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//")).count()
}

/// A file longer than this is read in pieces, which is when its seams stop being seen.
const CODE_LINES_MAX: usize = 1_200;

#[test]
fn no_source_file_outgrows_one_reading() {
    let root = repo();
    let mut files = Vec::new();
    for krate in crates(&root) {
        walk(&krate.join("src"), &|p| p.extension().is_some_and(|e| e == "rs"), &mut files);
    }
    assert!(files.len() > 50, "found too few source files to mean anything: {}", files.len());
    let long: Vec<String> = files
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .filter_map(|p| {
            let n = code_lines(&read(p));
            (n > CODE_LINES_MAX).then(|| format!("{}: {n} lines of code", p.strip_prefix(&root).unwrap_or(p).display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {CODE_LINES_MAX} lines of code outside tests; cut along a seam:\n{}",
        long.join("\n")
    );
}

/// The workspace's crates (directories with a Cargo.toml and a src/).
fn crates(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("the repository root")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("Cargo.toml").exists() && p.join("src").is_dir())
        .collect();
    out.sort();
    out
}

/// One module: its path from the crate root and its file.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// The modules of one crate root, by following `mod x;` declarations.
fn modules(root_file: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), root_file.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let text = strip_tests(&read(&file));
        // A module's children live beside a root or mod.rs, else in a folder named after it.
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = if path.is_empty() || stem == "mod" {
            file.parent().expect("a file has a directory").to_path_buf()
        } else {
            file.with_extension("")
        };
        for line in text.lines() {
            let l = line.trim();
            let l = l.strip_prefix("pub ").or_else(|| l.strip_prefix("pub(crate) ")).unwrap_or(l);
            let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else { continue };
            let child = [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{}: mod {name} has no file", file.display()));
            let mut p = path.clone();
            p.push(name.to_string());
            todo.push((p, child));
        }
        out.push(Module { path, file });
    }
    out
}

/// A file's code without its test module, its comments and its string literals' contents.
fn strip_tests(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<i32> = None;
    let mut depth = 0i32;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("//") {
            continue;
        }
        if skip_depth.is_none()
            && pending_cfg_test
            && (t.starts_with("mod ") || t.starts_with("pub mod "))
            && t.ends_with('{')
        {
            skip_depth = Some(depth);
        }
        pending_cfg_test = t == "#[cfg(test)]" || (pending_cfg_test && t.starts_with("#["));
        let code: String = line.split('"').step_by(2).collect::<Vec<_>>().join("\"\"");
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
        if let Some(d) = skip_depth {
            if depth <= d {
                skip_depth = None;
            }
            continue;
        }
        out.push_str(&code);
        out.push('\n');
    }
    out
}

/// The paths a module's code names: `use` trees expanded, and inline `crate::`/`super::`
/// paths, each as its segments.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before_ok = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric() && rest.as_bytes()[at - 1] != b'_';
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        if before_ok {
            let tree: String = tail[..end].chars().filter(|c| !c.is_whitespace()).collect();
            expand(&[], &tree, &mut out);
        }
        rest = &tail[end.min(tail.len())..];
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let path: String =
                code[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            out.push(path.split("::").filter(|s| !s.is_empty()).map(String::from).collect());
        }
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let Some(brace) = tree.find('{') else {
        let mut p = prefix.to_vec();
        p.extend(tree.split(" as ").next().unwrap_or(tree).split("::").filter(|s| !s.is_empty()).map(String::from));
        out.push(p);
        return;
    };
    let mut p = prefix.to_vec();
    p.extend(tree[..brace].split("::").filter(|s| !s.is_empty()).map(String::from));
    let inner = &tree[brace + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut from) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&p, &inner[from..i], out);
                from = i + 1;
            }
            _ => {}
        }
    }
    expand(&p, &inner[from..], out);
}

/// The module a path names from `at`, or None outside the crate.
fn resolve(at: &[String], path: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super") | Some("self") => at.to_vec(),
        Some(first) => {
            let mut child = at.to_vec();
            child.push(first.to_string());
            if !known.contains(&child) {
                return None;
            }
            at.to_vec()
        }
        None => return None,
    };
    let mut segs = path.iter().peekable();
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "crate" | "self" => {}
            "super" => {
                base.pop()?;
            }
            _ => break,
        }
        segs.next();
    }
    for s in segs {
        let mut next = base.clone();
        next.push(s.clone());
        if !known.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// The circles among siblings in one crate root's module tree, each as its module paths.
fn circles(root_file: &Path) -> Vec<String> {
    let mods = modules(root_file);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    // Edges between siblings, keyed by their parent.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for m in &mods {
        let code = strip_tests(&read(&m.file));
        for path in named_paths(&code) {
            let Some(to) = resolve(&m.path, &path, &known) else { continue };
            let common = m.path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == m.path.len() || common == to.len() {
                continue; // ancestor or descendant
            }
            edges.entry(m.path[..common].to_vec()).or_default().insert((m.path[common].clone(), to[common].clone()));
        }
    }
    let mut found = Vec::new();
    for (parent, es) in &edges {
        for cycle in cycles(es) {
            let name = |c: &String| if parent.is_empty() { c.clone() } else { format!("{}::{c}", parent.join("::")) };
            found.push(cycle.iter().map(name).collect::<Vec<_>>().join(" -> "));
        }
    }
    found
}

/// One circle through each strongly connected set of nodes with more than one node.
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let reaches = |from: &String, to: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for (a, b) in edges {
                if a == n && seen.insert(b) {
                    todo.push(b);
                }
            }
        }
        seen.contains(to)
    };
    let mut done: BTreeSet<&String> = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(n) || !reaches(n, n) {
            continue;
        }
        let members: Vec<String> =
            nodes.iter().filter(|m| reaches(n, m) && reaches(m, n)).map(|m| (*m).clone()).collect();
        for m in &members {
            done.insert(nodes.iter().find(|x| **x == m).copied().expect("a member is a node"));
        }
        let mut c = members;
        c.push(c[0].clone());
        out.push(c);
    }
    out
}

#[test]
fn no_module_imports_go_round_in_a_circle() {
    let root = repo();
    let mut roots = Vec::new();
    for krate in crates(&root) {
        for f in ["lib.rs", "main.rs"] {
            let p = krate.join("src").join(f);
            if p.exists() {
                roots.push(p);
            }
        }
    }
    assert!(roots.len() >= 8, "found too few crate roots: {roots:?}");
    let found: Vec<String> = roots
        .iter()
        .map(|r| (r, r.strip_prefix(&root).unwrap_or(r).display().to_string()))
        .flat_map(|(r, shown)| circles(r).into_iter().map(move |c| format!("{shown}: {c}")))
        .collect();
    assert!(found.is_empty(), "import circles (move the shared piece into a leaf module):\n{}", found.join("\n"));
}

/// The checker sees a circle where there is one, and none between parent and child.
#[test]
fn the_circle_check_finds_a_circle_and_passes_a_tree() {
    let dir = std::env::temp_dir().join(format!("rocemesh-house-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, t: &str| std::fs::write(dir.join(p), t).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write("a.rs", "//! a\nmod inner;\nuse crate::b::f;\n");
    write("a/inner.rs", "use super::super::c::{g, h as k};\n");
    write("b.rs", "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::c::g;\n}\n");
    write("c.rs", "pub fn g() { crate::b::f() }\n");
    assert!(circles(&dir.join("lib.rs")).is_empty(), "a -> b, a -> c -> b is no circle; tests do not count");
    write("c.rs", "pub fn g() { crate::a::inner::x() }\n");
    assert_eq!(circles(&dir.join("lib.rs")), vec!["a -> c -> a".to_string()]);
    write("c.rs", "pub fn g() {}\n");
    write("b.rs", "use crate::a::{self};\n");
    assert_eq!(circles(&dir.join("lib.rs")), vec!["a -> b -> a".to_string()]);
    std::fs::remove_dir_all(&dir).unwrap();
}
