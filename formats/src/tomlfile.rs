//! The machinery shared by the TOML formats ([`crate::inventory`], [`crate::pinglist`]):
//! reading a file, the `version` gate, deserialization, and turning every failure into a
//! [`FileError`] that names the file, the line and the field.
//!
//! A document is parsed into toml's spanned tree ([`DeTable`]); the typed value is
//! deserialized from that tree, and the same tree maps a field path to a line (for
//! semantic errors found after deserialization) and a byte span back to a field path (for
//! errors serde reports). Because the reported line is looked up from the reported path,
//! the two cannot disagree. Deserialization consumes the tree (copying it cost a 100,000-host
//! inventory a sixth of its load time); an error found afterwards parses the text again,
//! which gives the same tree.

use std::cell::OnceCell;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::{DeserializeOwned, IntoDeserializer};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Why a TOML file (inventory or pinglist) was refused, with where and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}{}{}: {problem} (fix: {fix})",
    .file.display(),
    display_line(*.line),
    display_field(.field)
)]
pub struct FileError {
    /// The file the error is about.
    pub file: PathBuf,
    /// 1-based line, when the error is about one place in the file.
    pub line: Option<usize>,
    /// Dotted field path such as `target[3].rate_pps`; empty when not about one field.
    pub field: String,
    /// What is wrong.
    pub problem: String,
    /// What the operator should do about it.
    pub fix: String,
}

fn display_line(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn display_field(field: &str) -> String {
    if field.is_empty() { String::new() } else { format!(": {field}") }
}

impl FileError {
    /// An error about `field` (a dotted path, or "") at `line` of `file`.
    pub fn new(
        file: &Path,
        line: Option<usize>,
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        FileError { file: file.to_path_buf(), line, field: field.into(), problem: problem.into(), fix: fix.into() }
    }

    fn whole_file(file: &Path, problem: String, fix: &str) -> Self {
        FileError { file: file.to_path_buf(), line: None, field: String::new(), problem, fix: fix.to_owned() }
    }
}

/// Reads `path` as UTF-8 text.
pub(crate) fn read_text(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|e| read_error(path, &e))
}

/// The error of failing to open or read `path` as UTF-8 text, with its fix.
pub(crate) fn read_error(path: &Path, e: &std::io::Error) -> FileError {
    let fix = match e.kind() {
        std::io::ErrorKind::NotFound => "check the path; the file must exist and be readable by this user",
        std::io::ErrorKind::PermissionDenied => "make the file readable by this user",
        std::io::ErrorKind::InvalidData => "the file must be UTF-8 text",
        _ => "check that the file exists and is readable by this user",
    };
    FileError::whole_file(path, format!("cannot read the file: {e}"), fix)
}

/// 1-based line number of `byte_offset` in `text`; offsets past the end count as the last
/// line (toml reports end-of-input errors one past the last byte).
pub(crate) fn line_of(text: &str, byte_offset: usize) -> usize {
    let end = byte_offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// One step of a [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// Where a value sits in a document, e.g. `host[4].rnic[1].tor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Segment>);

impl FieldPath {
    /// The document itself (renders as "").
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Key(key.to_owned()));
        FieldPath(segments)
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        FieldPath(segments)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(k) if i == 0 => write!(f, "{k}")?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A parsed TOML document whose `version` has been checked.
pub(crate) struct Document<'i> {
    file: &'i Path,
    text: &'i str,
    /// Empty once [`Document::deserialize`] has consumed it; [`Document::root`] refills it.
    root: OnceCell<Spanned<DeTable<'i>>>,
}

/// What a format tells [`Document::parse`] about its `version` field.
pub(crate) struct VersionGate<'a> {
    /// Used in messages: "pinglist format version 2 is not supported ...".
    pub(crate) format: &'a str,
    pub(crate) supported: i64,
    /// What to do when the file has another version.
    pub(crate) mismatch_fix: &'a str,
}

impl<'i> Document<'i> {
    /// Parses the TOML syntax and checks `version` before anything else, so that a file of
    /// a future format (whose fields this build does not know) is refused for its version
    /// rather than for an "unknown field".
    pub(crate) fn parse(file: &'i Path, text: &'i str, gate: &VersionGate<'_>) -> Result<Self, FileError> {
        let root = DeTable::parse(text).map_err(|e| FileError {
            file: file.to_path_buf(),
            line: e.span().map(|s| line_of(text, s.start)),
            field: String::new(),
            problem: format!("invalid TOML: {}", e.message()),
            fix: "correct the TOML syntax at this line".to_owned(),
        })?;
        let doc = Document { file, text, root: OnceCell::from(root) };
        doc.check_version(gate)?;
        Ok(doc)
    }

    /// A document for `text` whose tree is parsed only if an error needs a line: for a
    /// caller that deserialized `text` some other way (in parts, in parallel) and has checked
    /// that it parses.
    pub(crate) fn unparsed(file: &'i Path, text: &'i str) -> Self {
        Document { file, text, root: OnceCell::new() }
    }

    /// Parses `text` and deserializes it into `T` without the version gate or any error
    /// detail: `None` for any failure (the caller then parses the whole file the usual way,
    /// which names the problem).
    pub(crate) fn quietly<T: DeserializeOwned>(text: &'i str) -> Option<T> {
        T::deserialize(DeTable::parse(text).ok()?.into_deserializer()).ok()
    }

    /// The tree, parsed again if deserialization consumed it. `None` only if the text no
    /// longer parses, which cannot happen to text that parsed once; errors then lack a line.
    fn root(&self) -> Option<&Spanned<DeTable<'i>>> {
        if self.root.get().is_none() {
            let root = DeTable::parse(self.text).ok()?;
            let _ = self.root.set(root);
        }
        self.root.get()
    }

    fn check_version(&self, gate: &VersionGate<'_>) -> Result<(), FileError> {
        let path = FieldPath::root().key("version");
        let Some(value) = self.root().and_then(|r| r.get_ref().get("version")) else {
            return Err(self.error(
                &path,
                format!("the {} has no `version`", gate.format),
                format!("add `version = {}` at the top of the file", gate.supported),
            ));
        };
        let version = match value.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok(),
            _ => None,
        };
        match version {
            Some(v) if v == gate.supported => Ok(()),
            Some(v) => Err(self.error(
                &path,
                format!(
                    "{} format version {v} is not supported by this build (it reads version {})",
                    gate.format, gate.supported
                ),
                gate.mismatch_fix,
            )),
            None => Err(self.error(
                &path,
                format!("`version` must be an integer, found {}", value.get_ref().type_str()),
                format!("write `version = {}`", gate.supported),
            )),
        }
    }

    /// Deserializes the whole document into `T`; serde's errors (unknown field, wrong
    /// type, bad address, ...) come back with the line and field path they are about.
    pub(crate) fn deserialize<T: DeserializeOwned>(&mut self) -> Result<T, FileError> {
        let Some(root) = self.root.take().or_else(|| DeTable::parse(self.text).ok()) else {
            return Err(FileError::whole_file(
                self.file,
                "the TOML no longer parses".to_owned(),
                "report this as a bug",
            ));
        };
        T::deserialize(root.into_deserializer()).map_err(|e| {
            let message = e.message();
            let fix = if message.starts_with("unknown field") {
                "remove the field or correct its spelling (the accepted fields are listed)"
            } else if message.starts_with("missing field") {
                "add the missing field"
            } else if message.starts_with("unknown variant") {
                "use one of the listed values"
            } else {
                "correct the value"
            };
            // An error about the document as a whole (a missing top-level field) spans all
            // of it; its first line would be a misleading place to look.
            let path = e.span().map(|span| (self.path_at(&span), span));
            let (line, field) = match path {
                Some((path, span)) if path != FieldPath::root() => {
                    (Some(line_of(self.text, span.start)), path.to_string())
                }
                _ => (None, String::new()),
            };
            FileError { file: self.file.to_path_buf(), line, field, problem: message.to_owned(), fix: fix.to_owned() }
        })
    }

    /// An error about the value at `path`, with the line it is written on.
    pub(crate) fn error(&self, path: &FieldPath, problem: impl Into<String>, fix: impl Into<String>) -> FileError {
        FileError {
            file: self.file.to_path_buf(),
            line: self.line_of_path(path),
            field: path.to_string(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// The line `path` is written on; for a path that is absent (a missing optional field,
    /// an empty array) the line of its deepest present ancestor, which is where the
    /// operator has to add it.
    pub(crate) fn line_of_path(&self, path: &FieldPath) -> Option<usize> {
        let mut table: Option<&DeTable<'i>> = self.root().map(Spanned::get_ref);
        let mut items: Option<&[Spanned<DeValue<'i>>]> = None;
        let mut best: Option<Range<usize>> = None;
        for segment in &path.0 {
            let found = match segment {
                Segment::Key(k) => table.and_then(|t| t.get_key_value(k.as_str())).map(|(key, v)| (key.span(), v)),
                Segment::Index(n) => items.and_then(|a| a.get(*n)).map(|v| (v.span(), v)),
            };
            let Some((span, value)) = found else { break };
            best = Some(span);
            (table, items) = match value.get_ref() {
                DeValue::Table(t) => (Some(t), None),
                DeValue::Array(a) => (None, Some(&a[..])),
                _ => (None, None),
            };
        }
        best.map(|s| line_of(self.text, s.start))
    }

    /// The deepest field whose key or value covers `span`.
    fn path_at(&self, span: &Range<usize>) -> FieldPath {
        let mut path = FieldPath::root();
        if let Some(root) = self.root() {
            descend_table(root.get_ref(), span, &mut path);
        }
        path
    }
}

fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

// The span of an array-of-tables entry is only its `[[header]]` line, not its body, so the
// search looks inside every container instead of pruning by span.
fn descend_table(table: &DeTable<'_>, span: &Range<usize>, path: &mut FieldPath) -> bool {
    for (key, value) in table.iter() {
        let before = path.0.len();
        path.0.push(Segment::Key(key.get_ref().to_string()));
        if covers(&key.span(), span) || descend_value(value, span, path) {
            return true;
        }
        if covers(&value.span(), span) {
            return true;
        }
        path.0.truncate(before);
    }
    false
}

fn descend_value(value: &Spanned<DeValue<'_>>, span: &Range<usize>, path: &mut FieldPath) -> bool {
    match value.get_ref() {
        DeValue::Table(t) => descend_table(t, span, path),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let before = path.0.len();
                path.0.push(Segment::Index(i));
                if descend_value(item, span, path) || covers(&item.span(), span) {
                    return true;
                }
                path.0.truncate(before);
            }
            false
        }
        _ => false,
    }
}

/// Whether `name` may be used as a switch, host or device name; `None` when it is fine. They
/// are joined with `/` and `|` into entity names (`tor3-h5/mlx5_0`, `tor0|spine1`), so those
/// and anything that needs quoting elsewhere are refused. The one rule for every file and tool
/// that names them (public as `inventory::name_problem`); the message says what is wrong,
/// [`NAME_FIX`] how to fix it.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the name is empty".to_owned());
    }
    name.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        .map(|c| format!("the name {name:?} contains {c:?}, which is not allowed"))
}

/// The fix that goes with [`name_problem`].
pub const NAME_FIX: &str =
    "use only letters, digits, '.', '_', ':' and '-' (names are joined with '/' and '|' into entity names)";

/// Helpers shared by the tests of the file formats.
#[cfg(test)]
pub(crate) mod testing {
    /// The ```toml example in a module's documentation (`source` is its `include_str!`), so the
    /// documentation cannot go stale.
    pub(crate) fn doc_example(source: &str) -> String {
        let mut lines = source
            .lines()
            .map_while(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .skip_while(|l| *l != "```toml")
            .skip(1);
        let mut out = String::new();
        for line in lines.by_ref() {
            if line == "```" {
                break;
            }
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Test documents are written indented; line 1 is the first line after the opening quote.
    pub(crate) fn doc(text: &str) -> String {
        let text = text.strip_prefix('\n').unwrap_or(text);
        text.lines().map(|l| l.trim_start()).collect::<Vec<_>>().join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const GATE: VersionGate<'static> = VersionGate { format: "test", supported: 1, mismatch_fix: "use version 1" };

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        version: u32,
        #[serde(default)]
        item: Vec<Item>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        n: u8,
        #[serde(default)]
        list: Vec<u8>,
    }

    fn parse(text: &str) -> Result<Doc, FileError> {
        Document::parse(Path::new("t.toml"), text, &GATE)?.deserialize()
    }

    #[test]
    fn line_of_counts_from_one() {
        let text = "a\nbb\n\nccc";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 1), 1);
        assert_eq!(line_of(text, 2), 2);
        assert_eq!(line_of(text, 5), 3);
        assert_eq!(line_of(text, 6), 4);
        assert_eq!(line_of(text, 999), 4);
        assert_eq!(line_of("", 0), 1);
    }

    #[test]
    fn display_includes_line_and_field_only_when_present() {
        let mut e = FileError {
            file: PathBuf::from("/etc/x.toml"),
            line: Some(7),
            field: "target[3].rate_pps".to_owned(),
            problem: "too fast".to_owned(),
            fix: "slow down".to_owned(),
        };
        assert_eq!(e.to_string(), "/etc/x.toml:7: target[3].rate_pps: too fast (fix: slow down)");
        e.line = None;
        e.field.clear();
        assert_eq!(e.to_string(), "/etc/x.toml: too fast (fix: slow down)");
    }

    #[test]
    fn field_path_renders_keys_and_indices() {
        let p = FieldPath::root().key("host").index(4).key("rnic").index(1).key("tor");
        assert_eq!(p.to_string(), "host[4].rnic[1].tor");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn serde_errors_carry_line_and_path() {
        let text = "version = 1\n[[item]]\nn = 1\n[[item]]\nn = 2\nlist = [1,\n  300]\n";
        let e = parse(text).unwrap_err();
        assert_eq!(e.line, Some(7));
        assert_eq!(e.field, "item[1].list[1]");
        assert!(e.problem.contains("300"), "{e}");

        let e = parse("version = 1\n[[item]]\nn = 1\nm = 2\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(4), "item[0].m"));
        assert!(e.problem.contains("unknown field `m`"), "{e}");

        let e = parse("version = 1\n[[item]]\nn = 1\n[[item]]\nlist = []\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(4), "item[1]"));
        assert!(e.problem.contains("missing field `n`"), "{e}");

        #[derive(Debug, Deserialize)]
        struct Needs {
            #[allow(dead_code)]
            needed: u8,
        }
        let mut doc = Document::parse(Path::new("t.toml"), "# comment\nversion = 1\n", &GATE).unwrap();
        let e = doc.deserialize::<Needs>().unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (None, ""));
        assert!(e.problem.contains("missing field `needed`"), "{e}");
    }

    #[test]
    fn line_of_path_falls_back_to_the_deepest_present_ancestor() {
        let text = "version = 1\n[[item]]\nn = 1\n\n[[item]]\nn = 2\nlist = [\n 1,\n 2]\n";
        let doc = Document::parse(Path::new("t.toml"), text, &GATE).unwrap();
        let item1 = FieldPath::root().key("item").index(1);
        assert_eq!(doc.line_of_path(&item1), Some(5));
        assert_eq!(doc.line_of_path(&item1.key("n")), Some(6));
        assert_eq!(doc.line_of_path(&item1.key("list").index(1)), Some(9));
        assert_eq!(doc.line_of_path(&item1.key("absent")), Some(5));
        assert_eq!(doc.line_of_path(&FieldPath::root().key("item").index(0).key("list")), Some(2));
        assert_eq!(doc.line_of_path(&FieldPath::root().key("nothing")), None);
    }

    #[test]
    fn version_is_checked_before_fields() {
        let e = parse("version = 2\nfuture_field = true\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(1), "version"));
        assert_eq!(e.problem, "test format version 2 is not supported by this build (it reads version 1)");
        let e = parse("version = \"1\"\n").unwrap_err();
        assert!(e.problem.contains("must be an integer, found string"), "{e}");
        let e = parse("[[item]]\nn = 1\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (None, "version"));
        assert!(e.fix.contains("version = 1"), "{e}");
        assert_eq!(parse("version = 0x1\n").unwrap().version, 1);
    }

    #[test]
    fn syntax_error_has_the_line() {
        let e = parse("version = 1\n[[item]]\nn = [1, 2\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.problem.starts_with("invalid TOML"), "{e}");
    }

    #[test]
    fn read_text_names_the_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let e = read_text(&path).unwrap_err();
        assert_eq!(e.file, path);
        assert!(e.to_string().starts_with(&path.display().to_string()));
        assert!(e.fix.contains("check the path"), "{e}");
    }

    #[test]
    fn names_are_restricted() {
        assert_eq!(name_problem("tor-0.a_b:c"), None);
        assert!(name_problem("").unwrap().contains("empty"));
        assert!(name_problem("a/b").unwrap().contains("'/'"));
        assert!(name_problem("a b").unwrap().contains("' '"));
    }
}
