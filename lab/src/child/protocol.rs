//! What a child process and its owner say to each other: the child writes lines on its stdout,
//! each [`PREFIX`] and a JSON object whose `kind` says what the line is (`ready`, `done`, ...,
//! or [`ERROR`] with its `text` when it fails); the owner writes commands on the child's stdin
//! ([`GO`], [`QUIT`]). Lines without the prefix are not part of the protocol (a library's stray
//! output): the owner keeps them for its error messages.

use std::io::Write;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Every protocol line starts with this word.
pub const PREFIX: &str = "@vkgdr";
/// The owner's command: start (the start barrier of a timed part).
pub const GO: &str = "go";
/// The owner's command: finish and exit (end of stdin means the same).
pub const QUIT: &str = "quit";
/// The kind of the line a failing child says last.
pub const ERROR: &str = "error";

/// One protocol line: its kind and its fields (an [`ERROR`] line's one field is its `text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// What the line says (`ready`, `done`, `lat`, ...).
    pub kind: String,
    /// The fields, by name.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl Line {
    /// A line of `kind` without fields.
    pub fn new(kind: &str) -> Line {
        Line {
            kind: kind.to_string(),
            fields: Map::new(),
        }
    }

    /// A line of `kind` whose fields are those of `fields` (a struct).
    pub fn of(kind: &str, fields: &impl Serialize) -> Line {
        match serde_json::to_value(fields) {
            Ok(Value::Object(fields)) => Line {
                kind: kind.to_string(),
                fields,
            },
            other => panic!("the fields of a protocol line are a struct's: {other:?}"),
        }
    }

    /// The line a failing child says: `text` on one line.
    pub fn error(text: &str) -> Line {
        Line::new(ERROR).with("text", text.lines().collect::<Vec<_>>().join(" | "))
    }

    /// Adds the field `key`.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Line {
        debug_assert!(key != "kind");
        let value = serde_json::to_value(value).expect("a protocol field is plain data");
        self.fields.insert(key.to_string(), value);
        self
    }

    /// The text of an [`ERROR`] line (empty for another line).
    pub fn text(&self) -> &str {
        self.fields
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The line as written, without its newline.
    pub fn to_text(&self) -> String {
        format!(
            "{PREFIX} {}",
            serde_json::to_string(self).expect("plain data")
        )
    }

    /// The protocol line `s` is, if it is one.
    pub fn parse(s: &str) -> Option<Line> {
        let rest = s.trim_end_matches(['\r', '\n']).strip_prefix(PREFIX)?;
        serde_json::from_str(rest.strip_prefix(' ')?).ok()
    }

    /// The fields as a `T` (a struct of the fields it needs).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_value(Value::Object(self.fields.clone()))
            .map_err(|e| format!("`{}`: {e}: {}", self.kind, self.to_text()))
    }

    fn get(&self, key: &str) -> Result<&Value, String> {
        (self.fields.get(key))
            .ok_or_else(|| format!("`{}` has no {key}: {}", self.kind, self.to_text()))
    }

    /// The value of `key` as a whole number.
    pub fn u64(&self, key: &str) -> Result<u64, String> {
        let v = self.get(key)?;
        v.as_u64()
            .ok_or_else(|| format!("`{}`: {key}={v} is no whole number", self.kind))
    }

    /// The value of `key` as a number.
    pub fn f64(&self, key: &str) -> Result<f64, String> {
        let v = self.get(key)?;
        v.as_f64()
            .ok_or_else(|| format!("`{}`: {key}={v} is no number", self.kind))
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
            .with("accepted_ns", 1_234u128)
            .with("why", "two words");
        assert_eq!(
            line.to_text(),
            r#"@vkgdr {"kind":"done","accepted_ns":1234,"push_ns":81.5,"records":2000000,"why":"two words"}"#
        );
        let back = Line::parse(&format!("{}\n", line.to_text())).unwrap();
        assert_eq!(back, line);
        assert_eq!(back.u64("records"), Ok(2_000_000));
        assert_eq!(back.f64("push_ns"), Ok(81.5));
        assert_eq!(back.f64("accepted_ns"), Ok(1234.0));
        assert!(back.u64("push_ns").unwrap_err().contains("no whole number"));
        assert!(back.u64("nope").unwrap_err().contains("has no nope"));
        let list = Line::new("attach").with("ns", [1.2, 30.0, 4e6]);
        assert_eq!(
            list.to_text(),
            r#"@vkgdr {"kind":"attach","ns":[1.2,30.0,4000000.0]}"#
        );
        let parse = |s: &str| Line::parse(s).unwrap();
        // A figure that is not finite is written as null: no number.
        assert!(parse(&Line::new("x").with("v", f64::INFINITY).to_text())
            .f64("v")
            .is_err());
        assert_eq!(parse(r#"@vkgdr {"kind":"quiet"}"#), Line::new("quiet"));
    }

    #[test]
    fn fields_read_as_a_struct() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Done {
            records: u64,
            push_ns: f64,
        }
        let line = Line::new("done")
            .with("records", 7)
            .with("push_ns", 3)
            .with("x", 1);
        assert_eq!(
            line.read(),
            Ok(Done {
                records: 7,
                push_ns: 3.0
            })
        );
        let e = Line::new("done")
            .with("records", 7)
            .read::<Done>()
            .unwrap_err();
        assert!(e.contains("missing field `push_ns`"), "{e}");
        let done = Done {
            records: 2,
            push_ns: 0.5,
        };
        assert_eq!(
            Line::of("done", &done).to_text(),
            r#"@vkgdr {"kind":"done","push_ns":0.5,"records":2}"#
        );
        assert_eq!(Line::of("done", &done).read(), Ok(done));
    }

    #[test]
    fn an_error_line_carries_its_text_on_one_line() {
        let e = Line::error("attach_lane(\"in\"): refused\nby the owner");
        assert_eq!(
            e.to_text(),
            r#"@vkgdr {"kind":"error","text":"attach_lane(\"in\"): refused | by the owner"}"#
        );
        let back = Line::parse(&e.to_text()).unwrap();
        assert_eq!(back.kind, ERROR);
        assert_eq!(back.text(), "attach_lane(\"in\"): refused | by the owner");
        assert_eq!(Line::new("done").text(), "");
    }

    #[test]
    fn other_output_is_no_protocol_line() {
        for s in [
            "",
            r#"{"kind":"ready"}"#,
            r#"@vkgdr{"kind":"ready"}"#,
            "@vkgdr ",
            "@vkgdr ready lane=1",
            r#"@vkgdr {"lane":1}"#,
            r#"@vkgdr {"kind":"ready""#,
            r#" @vkgdr {"kind":"ready"}"#,
            "WARNING: something the driver printed",
        ] {
            assert_eq!(Line::parse(s), None, "{s:?}");
        }
    }
}
