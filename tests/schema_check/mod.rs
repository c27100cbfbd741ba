//! A validator for the subset of JSON Schema (draft 2020-12) the files in
//! `vendor-schemas/plugin-api-1.x/` use, so the tests can check every line
//! the host writes without a jsonschema crate: `type`, `properties`,
//! `required`, `additionalProperties` (false or a schema), `enum`, `const`,
//! `pattern`, `minLength`/`maxLength` (in characters), `minimum`/`maximum`,
//! `items`, `minItems`/`maxItems`, `uniqueItems`, `oneOf`, `anyOf`,
//! `allOf`, `not`, `if`/`then`/`else`, and `$ref` to a file and a JSON
//! pointer. Other keywords are annotations (`title`, `description`) and are
//! skipped.
//!
//! `pattern` is matched by a small backtracking matcher of its own
//! ([`Regex`]), not by the crate's predicates, so the schemas test the code
//! rather than the code testing itself. It knows what the schemas' patterns
//! use: anchors, literals and escapes (`\.` `\\` `\[` `\]` `\n` `\t` `\s`
//! `\xNN`), classes with ranges and negation, `\p{Cc}` `\p{Cf}` `\p{Cs}`
//! `\p{Zl}` `\p{Zp}` (Cf from the crate's table, the only borrowed piece),
//! groups `(?:...)`, alternation, `*` `+` `?` `{m}` `{m,n}`, and the
//! negative lookahead `(?!...)`.

#![allow(dead_code)] // each test binary uses a different part

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
enum Item {
    Range(char, char),
    Prop(String),
    Space,
}

#[derive(Debug, Clone)]
enum Node {
    Char(char),
    Class(Vec<Item>, bool),
    Start,
    End,
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Rep(Box<Node>, usize, Option<usize>),
    NotAhead(Box<Node>),
}

/// A compiled pattern.
pub struct Regex(Node);

struct Parser<'a> {
    s: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn alt(&mut self) -> Node {
        let mut arms = vec![self.seq()];
        while self.peek() == Some('|') {
            self.i += 1;
            arms.push(self.seq());
        }
        if arms.len() == 1 {
            arms.pop().unwrap()
        } else {
            Node::Alt(arms)
        }
    }

    fn seq(&mut self) -> Node {
        let mut v = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom();
            v.push(self.quant(atom));
        }
        Node::Seq(v)
    }

    fn number(&mut self) -> usize {
        let mut n = 0;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(10)) {
            n = n * 10 + d as usize;
            self.i += 1;
        }
        n
    }

    fn quant(&mut self, atom: Node) -> Node {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.i += 1;
                let min = self.number();
                let max = if self.peek() == Some(',') {
                    self.i += 1;
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number())
                    }
                } else {
                    Some(min)
                };
                assert_eq!(self.peek(), Some('}'), "bad quantifier");
                self.i += 1;
                return Node::Rep(Box::new(atom), min, max);
            }
            _ => return atom,
        };
        self.i += 1;
        Node::Rep(Box::new(atom), min, max)
    }

    fn escape(&mut self) -> Item {
        let c = self.peek().expect("dangling escape");
        self.i += 1;
        match c {
            'n' => Item::Range('\n', '\n'),
            't' => Item::Range('\t', '\t'),
            's' => Item::Space,
            'x' => {
                let h: String = self.s[self.i..self.i + 2].iter().collect();
                self.i += 2;
                let c = char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap();
                Item::Range(c, c)
            }
            'p' => {
                assert_eq!(self.peek(), Some('{'));
                let end = self.s[self.i..].iter().position(|&c| c == '}').unwrap() + self.i;
                let name: String = self.s[self.i + 1..end].iter().collect();
                self.i = end + 1;
                Item::Prop(name)
            }
            other => Item::Range(other, other),
        }
    }

    fn class_char(&mut self) -> Item {
        let c = self.peek().expect("unclosed class");
        self.i += 1;
        if c == '\\' {
            self.escape()
        } else {
            Item::Range(c, c)
        }
    }

    fn atom(&mut self) -> Node {
        let c = self.peek().unwrap();
        self.i += 1;
        match c {
            '^' => Node::Start,
            '$' => Node::End,
            '(' => {
                let look = if self.s[self.i..].starts_with(&['?', ':']) {
                    self.i += 2;
                    false
                } else if self.s[self.i..].starts_with(&['?', '!']) {
                    self.i += 2;
                    true
                } else {
                    false
                };
                let inner = self.alt();
                assert_eq!(self.peek(), Some(')'), "unclosed group");
                self.i += 1;
                if look {
                    Node::NotAhead(Box::new(inner))
                } else {
                    inner
                }
            }
            '[' => {
                let neg = self.peek() == Some('^');
                if neg {
                    self.i += 1;
                }
                let mut items = Vec::new();
                while self.peek() != Some(']') {
                    let first = self.class_char();
                    if let Item::Range(a, _) = first {
                        if self.peek() == Some('-') && self.s.get(self.i + 1) != Some(&']') {
                            self.i += 1;
                            if let Item::Range(b, _) = self.class_char() {
                                items.push(Item::Range(a, b));
                                continue;
                            }
                        }
                    }
                    items.push(first);
                }
                self.i += 1;
                Node::Class(items, neg)
            }
            '\\' => match self.escape() {
                Item::Range(a, b) if a == b => Node::Char(a),
                item => Node::Class(vec![item], false),
            },
            '.' => Node::Class(vec![Item::Range('\n', '\n')], true),
            other => Node::Char(other),
        }
    }
}

fn in_prop(name: &str, c: char) -> bool {
    match name {
        "Cc" => omniconfluxd::plugins::text::is_cc(c),
        "Cf" => omniconfluxd::plugins::text::is_cf(c),
        "Cs" => false, // a Rust char is never a surrogate
        "Zl" => c == '\u{2028}',
        "Zp" => c == '\u{2029}',
        other => panic!("unknown property {other}"),
    }
}

fn class_has(items: &[Item], c: char) -> bool {
    items.iter().any(|i| match i {
        Item::Range(a, b) => (*a..=*b).contains(&c),
        Item::Prop(p) => in_prop(p, c),
        Item::Space => c.is_whitespace() || c == '\u{feff}',
    })
}

fn m(n: &Node, s: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match n {
        Node::Char(c) => i < s.len() && s[i] == *c && k(i + 1),
        Node::Class(items, neg) => i < s.len() && class_has(items, s[i]) != *neg && k(i + 1),
        Node::Start => i == 0 && k(i),
        Node::End => i == s.len() && k(i),
        Node::Seq(v) => seq(v, s, i, k),
        Node::Alt(v) => v.iter().any(|x| m(x, s, i, k)),
        Node::Rep(x, min, max) => rep(x, *min, *max, 0, s, i, k),
        Node::NotAhead(x) => !m(x, s, i, &mut |_| true) && k(i),
    }
}

fn seq(v: &[Node], s: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match v.split_first() {
        None => k(i),
        Some((first, rest)) => m(first, s, i, &mut |j| seq(rest, s, j, k)),
    }
}

fn rep(
    x: &Node,
    min: usize,
    max: Option<usize>,
    n: usize,
    s: &[char],
    i: usize,
    k: &mut dyn FnMut(usize) -> bool,
) -> bool {
    if max.is_none_or(|mx| n < mx)
        && m(x, s, i, &mut |j| j != i && rep(x, min, max, n + 1, s, j, k))
    {
        return true;
    }
    n >= min && k(i)
}

impl Regex {
    pub fn new(pattern: &str) -> Regex {
        let chars: Vec<char> = pattern.chars().collect();
        let mut p = Parser { s: &chars, i: 0 };
        let node = p.alt();
        assert_eq!(p.i, chars.len(), "pattern not fully parsed: {pattern}");
        Regex(node)
    }

    /// Whether the pattern matches somewhere in `text` (JSON Schema's
    /// search semantics; the schemas' patterns are anchored).
    pub fn is_match(&self, text: &str) -> bool {
        let s: Vec<char> = text.chars().collect();
        (0..=s.len()).any(|start| m(&self.0, &s, start, &mut |_| true))
    }
}

/// The schema files, loaded.
pub struct Schemas {
    root: PathBuf,
    docs: HashMap<String, Value>,
}

fn normalise(base: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = base.split('/').collect();
    parts.pop();
    for seg in rel.split('/') {
        match seg {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    parts.join("/")
}

impl Schemas {
    pub fn load() -> Schemas {
        Schemas::load_dir("vendor-schemas/plugin-api-1.x")
    }

    /// The schemas of another folder of vendor-schemas/ (`dir` from the
    /// crate root), for another wire.
    pub fn load_dir(dir: &str) -> Schemas {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut docs = HashMap::new();
        fn walk(root: &Path, dir: &Path, docs: &mut HashMap<String, Value>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(root, &p, docs);
                } else {
                    let rel = p
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/");
                    docs.insert(
                        rel,
                        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
                    );
                }
            }
        }
        walk(&root, &root, &mut docs);
        Schemas { root, docs }
    }

    /// Validates `v` against `file#pointer`; the errors name where.
    pub fn check(&self, file: &str, pointer: &str, v: &Value) -> Result<(), String> {
        let schema = self
            .docs
            .get(file)
            .and_then(|d| d.pointer(pointer))
            .unwrap_or_else(|| panic!("no schema {file}#{pointer}"));
        let mut errs = Vec::new();
        self.validate(file, schema, v, "$", &mut errs);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} against {file}#{pointer}: {}",
                v,
                errs.join("; ")
            ))
        }
    }

    fn resolve<'a>(&'a self, file: &str, r: &str) -> (String, &'a Value) {
        let (f, ptr) = r.split_once('#').unwrap_or((r, ""));
        let target = if f.is_empty() {
            file.to_string()
        } else {
            normalise(file, f)
        };
        let doc = self
            .docs
            .get(&target)
            .unwrap_or_else(|| panic!("no schema file {target} (from {file})"));
        (
            target.clone(),
            doc.pointer(ptr)
                .unwrap_or_else(|| panic!("no {ptr} in {target}")),
        )
    }

    fn ok(&self, file: &str, s: &Value, v: &Value) -> bool {
        let mut e = Vec::new();
        self.validate(file, s, v, "$", &mut e);
        e.is_empty()
    }

    fn validate(&self, file: &str, s: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
        let Some(o) = s.as_object() else {
            if s == &Value::Bool(false) {
                errs.push(format!("{at}: not allowed"));
            }
            return;
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            let (f, target) = self.resolve(file, r);
            self.validate(&f, target, v, at, errs);
        }
        if let Some(t) = o.get("type") {
            let types: Vec<&str> = match t {
                Value::String(x) => vec![x.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let fits = types.iter().any(|t| match *t {
                "object" => v.is_object(),
                "array" => v.is_array(),
                "string" => v.is_string(),
                "boolean" => v.is_boolean(),
                "null" => v.is_null(),
                "number" => v.is_number(),
                "integer" => {
                    v.as_i64().is_some()
                        || v.as_u64().is_some()
                        || v.as_f64().is_some_and(|f| f.fract() == 0.0)
                }
                _ => false,
            });
            if !fits {
                errs.push(format!("{at}: not of type {t}"));
                return;
            }
        }
        if let Some(e) = o.get("enum").and_then(Value::as_array) {
            if !e.contains(v) {
                errs.push(format!(
                    "{at}: {v} is not one of {}",
                    Value::Array(e.clone())
                ));
            }
        }
        if let Some(c) = o.get("const") {
            if c != v {
                errs.push(format!("{at}: {v} is not {c}"));
            }
        }
        if let Some(text) = v.as_str() {
            let n = text.chars().count() as u64;
            if o.get("minLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n < m)
            {
                errs.push(format!("{at}: shorter than minLength"));
            }
            if o.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
            {
                errs.push(format!("{at}: longer than maxLength"));
            }
            if let Some(p) = o.get("pattern").and_then(Value::as_str) {
                if !Regex::new(p).is_match(text) {
                    errs.push(format!("{at}: {text:?} does not match {p}"));
                }
            }
        }
        if let Some(x) = v.as_f64() {
            if o.get("minimum")
                .and_then(Value::as_f64)
                .is_some_and(|m| x < m)
            {
                errs.push(format!("{at}: below minimum"));
            }
            if o.get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|m| x > m)
            {
                errs.push(format!("{at}: above maximum"));
            }
        }
        if let Some(obj) = v.as_object() {
            let props = o.get("properties").and_then(Value::as_object);
            if let Some(req) = o.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !obj.contains_key(r) {
                        errs.push(format!("{at}: {r} is required"));
                    }
                }
            }
            for (k, x) in obj {
                match props.and_then(|p| p.get(k)) {
                    Some(ps) => self.validate(file, ps, x, &format!("{at}.{k}"), errs),
                    None => match o.get("additionalProperties") {
                        Some(Value::Bool(false)) => errs.push(format!("{at}: unknown member {k}")),
                        Some(extra @ Value::Object(_)) => {
                            self.validate(file, extra, x, &format!("{at}.{k}"), errs)
                        }
                        _ => {}
                    },
                }
            }
        }
        if let Some(arr) = v.as_array() {
            if o.get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| (arr.len() as u64) < m)
            {
                errs.push(format!("{at}: fewer than minItems"));
            }
            if o.get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| arr.len() as u64 > m)
            {
                errs.push(format!("{at}: more than maxItems"));
            }
            if o.get("uniqueItems") == Some(&Value::Bool(true))
                && arr.iter().enumerate().any(|(i, x)| arr[..i].contains(x))
            {
                errs.push(format!("{at}: an item twice"));
            }
            if let Some(items) = o.get("items") {
                for (i, x) in arr.iter().enumerate() {
                    self.validate(file, items, x, &format!("{at}[{i}]"), errs);
                }
            }
        }
        if let Some(all) = o.get("allOf").and_then(Value::as_array) {
            for s in all {
                self.validate(file, s, v, at, errs);
            }
        }
        if let Some(any) = o.get("anyOf").and_then(Value::as_array) {
            if !any.iter().any(|s| self.ok(file, s, v)) {
                errs.push(format!("{at}: fits none of anyOf"));
            }
        }
        if let Some(one) = o.get("oneOf").and_then(Value::as_array) {
            let n = one.iter().filter(|s| self.ok(file, s, v)).count();
            if n != 1 {
                let why: Vec<String> = one
                    .iter()
                    .map(|s| {
                        let mut e = Vec::new();
                        self.validate(file, s, v, at, &mut e);
                        e.join(", ")
                    })
                    .collect();
                errs.push(format!("{at}: fits {n} of oneOf [{}]", why.join(" | ")));
            }
        }
        if let Some(not) = o.get("not") {
            if self.ok(file, not, v) {
                errs.push(format!("{at}: matches not"));
            }
        }
        if let Some(cond) = o.get("if") {
            let branch = if self.ok(file, cond, v) {
                o.get("then")
            } else {
                o.get("else")
            };
            if let Some(b) = branch {
                self.validate(file, b, v, at, errs);
            }
        }
    }

    /// Checks one line the host wrote to a plugin: the message shape, then
    /// what the line carries. `asked` maps the plugin's request ids to their
    /// methods, to find the result schema of a response.
    pub fn check_host_line(
        &self,
        line: &str,
        asked: &HashMap<String, String>,
    ) -> Result<(), String> {
        assert!(line.len() <= 65_536, "a line over 65,536 bytes");
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
        self.check("message.schema.json", "", &v)?;
        if let (Some(m), Some(_)) = (v.get("method").and_then(Value::as_str), v.get("id")) {
            return self.check(
                &format!("calls/{m}.schema.json"),
                "/$defs/params",
                &v["params"],
            );
        }
        if let Some(e) = v.get("error") {
            return self.check("host-error.schema.json", "", e);
        }
        if let (Some(id), Some(r)) = (v.get("id").and_then(Value::as_str), v.get("result")) {
            let m = asked
                .get(id)
                .ok_or_else(|| format!("{line}: answers no request the plugin made"))?;
            return self.check(&format!("calls/{m}.schema.json"), "/$defs/result", r);
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[test]
fn the_matcher_knows_the_schemas_patterns() {
    let cases: &[(&str, &str, bool)] = &[
        ("^[A-Za-z0-9_.:-]{1,64}$", "h-1", true),
        ("^[A-Za-z0-9_.:-]{1,64}$", "", false),
        ("^[a-z]+(?:-[a-z]+)*$", "not-pending", true),
        ("^[a-z]+(?:-[a-z]+)*$", "not--pending", false),
        ("^t-[0-9a-f]{12}$", "t-0c1d2e3f4a5b", true),
        (
            "^(?:/(?!/)|[A-Za-z]:[\\\\/])[^\\p{Cc}\\p{Cf}\\p{Cs}\\p{Zl}\\p{Zp}]*$",
            "/srv/work",
            true,
        ),
        (
            "^(?:/(?!/)|[A-Za-z]:[\\\\/])[^\\p{Cc}\\p{Cf}\\p{Cs}\\p{Zl}\\p{Zp}]*$",
            "//share",
            false,
        ),
        (
            "^(?:/(?!/)|[A-Za-z]:[\\\\/])[^\\p{Cc}\\p{Cf}\\p{Cs}\\p{Zl}\\p{Zp}]*$",
            "/a\u{202e}b",
            false,
        ),
        ("^\\s*$", "  \t", true),
        ("^[!-~](?:[ -~]*[!-~])?$", "unit tests", true),
        ("^[!-~](?:[ -~]*[!-~])?$", "unit tests ", false),
        ("^[^\\x00-\\x1f\\x7f]*$", "one line", true),
        ("^[^\\x00-\\x1f\\x7f]*$", "two\nlines", false),
        (
            "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
            "2026-11-14T09:31:07.412Z",
            true,
        ),
        ("^[a-zA-Z0-9_-]+-a[1-9][0-9]*$", "s-4f9a-a1", true),
        ("^[a-zA-Z0-9_-]+-a[1-9][0-9]*$", "s-4f9a-a0", false),
        (
            "^[A-Za-z0-9][A-Za-z0-9_.:/\\[\\]-]{0,127}$",
            "gpt-6[x]",
            true,
        ),
    ];
    for (p, text, want) in cases {
        assert_eq!(Regex::new(p).is_match(text), *want, "{p} on {text:?}");
    }
}
