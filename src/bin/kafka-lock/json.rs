//! A minimal JSON object writer: kafka-lock prints a handful of flat objects and does not need a
//! serialization framework for them.

use std::fmt::Write;

/// Builds one JSON object, field by field, in insertion order.
#[derive(Debug, Default)]
pub struct Obj {
    buf: String,
}

impl Obj {
    pub fn new() -> Self {
        Obj {
            buf: String::from("{"),
        }
    }

    fn key(&mut self, k: &str) {
        if self.buf.len() > 1 {
            self.buf.push(',');
        }
        escape_into(&mut self.buf, k);
        self.buf.push(':');
    }

    pub fn str(mut self, k: &str, v: &str) -> Self {
        self.key(k);
        escape_into(&mut self.buf, v);
        self
    }

    pub fn opt_str(self, k: &str, v: Option<&str>) -> Self {
        match v {
            Some(v) => self.str(k, v),
            None => self.null(k),
        }
    }

    pub fn int(mut self, k: &str, v: impl Into<i128>) -> Self {
        self.key(k);
        let _ = write!(self.buf, "{}", v.into());
        self
    }

    pub fn opt_int(self, k: &str, v: Option<impl Into<i128>>) -> Self {
        match v {
            Some(v) => self.int(k, v),
            None => self.null(k),
        }
    }

    pub fn bool(mut self, k: &str, v: bool) -> Self {
        self.key(k);
        self.buf.push_str(if v { "true" } else { "false" });
        self
    }

    pub fn null(mut self, k: &str) -> Self {
        self.key(k);
        self.buf.push_str("null");
        self
    }

    /// A field whose value is already JSON (a nested object or array).
    pub fn raw(mut self, k: &str, json: &str) -> Self {
        self.key(k);
        self.buf.push_str(json);
        self
    }

    pub fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }
}

/// A JSON array of already-encoded values.
pub fn array(items: &[String]) -> String {
    format!("[{}]", items.join(","))
}

/// Appends `s` as a JSON string literal. Labels and member ids come from other hosts, so every
/// control character is escaped and the output stays one line.
pub fn escape_into(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // U+2028/2029 are valid JSON but break JavaScript line parsers.
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_that_could_break_a_line() {
        let s = Obj::new()
            .str("a\"b", "x\\y\n\u{1}\u{7f}\u{2028}é")
            .int("n", -3i32)
            .opt_str("none", None)
            .bool("t", true)
            .finish();
        assert_eq!(
            s,
            r#"{"a\"b":"x\\y\n\u0001\u007f\u2028é","n":-3,"none":null,"t":true}"#
        );
    }
}
