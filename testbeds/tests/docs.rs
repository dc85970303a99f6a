//! What the code and the docs cite ships with the repository: the scenario format's description
//! is `testbeds/scenarios/README.md`, its example is a valid scenario, and its links resolve.

use std::path::{Path, PathBuf};

use rocemesh_formats::scenario::Scenario;

fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}; it ships with the repository", path.display()))
}

#[test]
fn the_scenario_readme_ships_its_example_parses_and_its_links_resolve() {
    let dir = repo().join("testbeds/scenarios");
    let path = dir.join("README.md");
    let text = read(&path);
    let example = text
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("{}: no ```toml example", path.display()));
    let s = Scenario::parse(example, &path).unwrap_or_else(|e| panic!("the README's example: {e}"));
    assert_eq!(s.faults.len(), 1);
    for link in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
        assert!(dir.join(link).exists(), "{}: link {link} resolves to nothing", path.display());
    }
}

/// A file beside the checkout (a sibling `shared` directory) is not there for a user of the product.
#[test]
fn docs_and_code_cite_nothing_outside_the_repository() {
    let root = repo();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md"), root.join("Cargo.toml")];
    for dir in ["agent", "analyze", "bench", "testbeds", "formats", "ctl", "bpf", "scripts", ".ci", "docs", "deploy"] {
        collect(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found too few files to mean anything: {files:?}");
    // Built from pieces so that this file does not cite it itself.
    let needle = ["..", "shared", ""].join("/");
    let offenders: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let lines: Vec<String> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| l.contains(&needle))
                .map(|(i, _)| format!("{}:{}", p.strip_prefix(&root).unwrap_or(p).display(), i + 1))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "cite what ships (testbeds/scenarios/README.md, an ARCHITECTURE.md section, a module doc):\n{}",
        offenders.join("\n")
    );
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_none_or(|x| ["rs", "md", "toml", "sh"].contains(&x.to_str().unwrap_or(""))) {
            out.push(p);
        }
    }
}
