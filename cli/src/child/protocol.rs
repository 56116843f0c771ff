//! What a child process and its owner say to each other: the child writes lines on its stdout
//! (`@vkgdr KIND key=value ...`, or `@vkgdr error TEXT` when it fails), the owner writes
//! commands on the child's stdin ([`GO`], [`QUIT`]). Lines without the [`PREFIX`] are not part
//! of the protocol (a library's stray output): the owner keeps them for its error messages.

use std::fmt::Display;
use std::io::Write;

/// Every protocol line starts with this word.
pub const PREFIX: &str = "@vkgdr";
/// The owner's command: start (the start barrier of a timed part).
pub const GO: &str = "go";
/// The owner's command: finish and exit (end of stdin means the same).
pub const QUIT: &str = "quit";
/// The kind of the line a failing child says last.
pub const ERROR: &str = "error";

/// One protocol line: its kind and its `key=value` fields (or, for [`ERROR`], free text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// What the line says (`ready`, `done`, `lat`, ...).
    pub kind: String,
    /// The fields in the order written.
    pub fields: Vec<(String, String)>,
    /// The text of an [`ERROR`] line (empty otherwise).
    pub text: String,
}

impl Line {
    /// A line of `kind` without fields.
    pub fn new(kind: &str) -> Line {
        debug_assert!(!kind.is_empty() && !kind.contains(char::is_whitespace));
        Line {
            kind: kind.to_string(),
            fields: Vec::new(),
            text: String::new(),
        }
    }

    /// The line a failing child says: `text` on one line.
    pub fn error(text: &str) -> Line {
        Line {
            kind: ERROR.to_string(),
            fields: Vec::new(),
            text: text.lines().collect::<Vec<_>>().join(" | "),
        }
    }

    /// Adds `key=value` (whitespace in the value becomes `_`, so the line stays one line of
    /// fields).
    pub fn with(mut self, key: &str, value: impl Display) -> Line {
        debug_assert!(!key.is_empty() && !key.contains(['=', ' ']));
        let value = value.to_string().replace(char::is_whitespace, "_");
        self.fields.push((key.to_string(), value));
        self
    }

    /// Adds `key=a,b,c`: a list of numbers.
    pub fn with_list(self, key: &str, values: &[f64]) -> Line {
        let list: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
        self.with(key, list.join(","))
    }

    /// The line as written, without its newline.
    pub fn to_text(&self) -> String {
        if self.kind == ERROR {
            return format!("{PREFIX} {ERROR} {}", self.text);
        }
        let mut s = format!("{PREFIX} {}", self.kind);
        for (k, v) in &self.fields {
            s += &format!(" {k}={v}");
        }
        s
    }

    /// The protocol line `s` is, if it is one.
    pub fn parse(s: &str) -> Option<Line> {
        let rest = s.trim_end_matches(['\r', '\n']).strip_prefix(PREFIX)?;
        let rest = rest.strip_prefix(' ')?;
        let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        if kind.is_empty() {
            return None;
        }
        if kind == ERROR {
            return Some(Line::error(rest));
        }
        let mut line = Line::new(kind);
        for word in rest.split_whitespace() {
            let (k, v) = word.split_once('=')?;
            if k.is_empty() {
                return None;
            }
            line.fields.push((k.to_string(), v.to_string()));
        }
        Some(line)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Result<&str, String> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| format!("`{}` has no {key}: {}", self.kind, self.to_text()))
    }

    /// The value of `key` as a whole number.
    pub fn u64(&self, key: &str) -> Result<u64, String> {
        let v = self.get(key)?;
        v.parse()
            .map_err(|_| format!("`{}`: {key}={v} is no whole number", self.kind))
    }

    /// The value of `key` as a number.
    pub fn f64(&self, key: &str) -> Result<f64, String> {
        let v = self.get(key)?;
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("`{}`: {key}={v} is no number", self.kind))
    }

    /// The value of `key` as a list of numbers (`a,b,c`; empty: none).
    pub fn f64s(&self, key: &str) -> Result<Vec<f64>, String> {
        let v = self.get(key)?;
        if v.is_empty() {
            return Ok(Vec::new());
        }
        v.split(',')
            .map(|x| x.parse::<f64>().ok().filter(|x| x.is_finite()))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(|| format!("`{}`: {key} is no list of numbers", self.kind))
    }
}

/// Says `line` on stdout, at once (the owner waits for it).
pub fn say(line: &Line) {
    let mut out = std::io::stdout().lock();
    // The owner is gone if this fails: nothing to tell.
    let _ = writeln!(out, "{}", line.to_text());
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_as_written() {
        let line = Line::new("done")
            .with("records", 2_000_000u64)
            .with("push_ns", 81.5)
            .with("why", "two words");
        assert_eq!(
            line.to_text(),
            "@vkgdr done records=2000000 push_ns=81.5 why=two_words"
        );
        let back = Line::parse(&format!("{}\n", line.to_text())).unwrap();
        assert_eq!(back, line);
        assert_eq!(back.u64("records"), Ok(2_000_000));
        assert_eq!(back.f64("push_ns"), Ok(81.5));
        assert_eq!(back.get("why"), Ok("two_words"));
        assert!(back.u64("push_ns").unwrap_err().contains("no whole number"));
        assert!(back.get("nope").unwrap_err().contains("has no nope"));
        let list = Line::new("attach").with_list("ns", &[1.2, 30.0, 4e6]);
        assert_eq!(list.to_text(), "@vkgdr attach ns=1.2,30.0,4000000.0");
        assert_eq!(
            Line::parse(&list.to_text()).unwrap().f64s("ns"),
            Ok(vec![1.2, 30.0, 4e6])
        );
        assert_eq!(
            Line::parse("@vkgdr x ns=").unwrap().f64s("ns"),
            Ok(Vec::new())
        );
        assert!(Line::parse("@vkgdr x ns=1,a").unwrap().f64s("ns").is_err());
        assert!(Line::parse("@vkgdr x v=inf").unwrap().f64("v").is_err());
        assert_eq!(Line::parse("@vkgdr quiet").unwrap(), Line::new("quiet"));
    }

    #[test]
    fn an_error_line_carries_its_text_on_one_line() {
        let e = Line::error("attach_lane(\"in\"): refused\nby the owner");
        assert_eq!(
            e.to_text(),
            "@vkgdr error attach_lane(\"in\"): refused | by the owner"
        );
        let back = Line::parse(&e.to_text()).unwrap();
        assert_eq!(back.kind, ERROR);
        assert_eq!(back.text, "attach_lane(\"in\"): refused | by the owner");
        // Fields of an error line are its text.
        assert_eq!(Line::parse("@vkgdr error a=b c").unwrap().text, "a=b c");
    }

    #[test]
    fn other_output_is_no_protocol_line() {
        for s in [
            "",
            "ready lane=1",
            "@vkgdrready",
            "@vkgdr ",
            "@vkgdr  ready",
            "@vkgdr ready lane",
            "@vkgdr ready =1",
            " @vkgdr ready",
            "WARNING: something the driver printed",
        ] {
            assert_eq!(Line::parse(s), None, "{s:?}");
        }
    }
}
