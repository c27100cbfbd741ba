//! The verifier's verdict, parsed strictly (issue 5, "verifying": "answers
//! with a verdict in a format the daemon parses strictly (pass, or rework
//! with up to 50 cited defects)").
//!
//! The verifier is told to end its answer with exactly one fenced block
//! whose info string is `omniconflux-verdict` and whose body is one JSON
//! object:
//!
//! ````text
//! ```omniconflux-verdict
//! {"verdict": "pass"}
//! ```
//! ````
//!
//! or `{"verdict": "rework", "defects": [{"file": "src/a.rs", "line": 12,
//! "issue": "…"}]}` with 1 to 50 defects. Anything else — no block, two
//! blocks, unknown members, a pass with defects, a rework without any, a
//! path that leaves the repository — is not a verdict, and the lane goes to
//! verify-failed. JSON was chosen over a line format because agents already
//! emit it reliably and serde gives an exact, total parser.

use serde::Deserialize;

use crate::limits;

/// One defect the verifier cites.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defect {
    /// A path relative to the repository's top.
    pub file: String,
    #[serde(default)]
    pub line: Option<u32>,
    pub issue: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Rework(Vec<Defect>),
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Rework(_) => "rework",
        }
    }

    pub fn defects(&self) -> &[Defect] {
        match self {
            Verdict::Pass => &[],
            Verdict::Rework(d) => d,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    verdict: String,
    #[serde(default)]
    defects: Option<Vec<Defect>>,
}

pub const FENCE_TAG: &str = "omniconflux-verdict";

/// Why an answer is not a verdict; the text goes to the lane's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAVerdict(pub String);

/// Parses the verifier's whole answer.
pub fn parse(answer: &str) -> Result<Verdict, NotAVerdict> {
    let bad = |s: &str| Err(NotAVerdict(s.to_string()));
    let mut blocks = Vec::new();
    let mut lines = answer.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("```{FENCE_TAG}") {
            let mut body = String::new();
            let mut closed = false;
            for l in lines.by_ref() {
                if l.trim() == "```" {
                    closed = true;
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            if !closed {
                return bad("the verdict block is not closed");
            }
            blocks.push(body);
        }
    }
    let body = match blocks.as_slice() {
        [] => return bad("no omniconflux-verdict block"),
        [one] => one,
        _ => return bad("more than one omniconflux-verdict block"),
    };
    let raw: Raw = serde_json::from_str(body)
        .map_err(|e| NotAVerdict(format!("the verdict block is not valid: {e}")))?;
    match (raw.verdict.as_str(), raw.defects) {
        ("pass", None) => Ok(Verdict::Pass),
        ("pass", Some(d)) if d.is_empty() => Ok(Verdict::Pass),
        ("pass", Some(_)) => bad("a pass cites no defects"),
        ("rework", None) => bad("a rework must cite at least one defect"),
        ("rework", Some(d)) => {
            if d.is_empty() || d.len() > limits::LANE_MAX_DEFECTS {
                return bad("a rework cites 1 to 50 defects");
            }
            for defect in &d {
                check_defect(defect)?;
            }
            Ok(Verdict::Rework(d))
        }
        (other, _) => Err(NotAVerdict(format!(
            "verdict must be pass or rework, not {other:?}"
        ))),
    }
}

fn check_defect(d: &Defect) -> Result<(), NotAVerdict> {
    let path = std::path::Path::new(&d.file);
    let escapes = path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
    if d.file.is_empty() || d.file.len() > 4096 || escapes || d.file.chars().any(char::is_control) {
        return Err(NotAVerdict(format!(
            "defect file {:?} is not a path inside the repository",
            d.file
        )));
    }
    let len = d.issue.chars().count();
    if len == 0
        || len > limits::LANE_DEFECT_MAX_CHARS
        || d.issue
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(NotAVerdict(format!(
            "defect issue must be 1 to {} characters of text",
            limits::LANE_DEFECT_MAX_CHARS
        )));
    }
    Ok(())
}

/// The instructions appended to the verifier's prompt.
pub fn instructions() -> String {
    format!(
        "End your answer with exactly one fenced code block whose info string is {FENCE_TAG}, holding one JSON object: \
         {{\"verdict\": \"pass\"}} when the change does the task correctly, or {{\"verdict\": \"rework\", \"defects\": \
         [{{\"file\": \"path/relative/to/repo\", \"line\": 12, \"issue\": \"what is wrong\"}}]}} with 1 to {} defects. \
         Nothing else in the block.",
        limits::LANE_MAX_DEFECTS
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(body: &str) -> String {
        format!("I read the diff.\n\n```{FENCE_TAG}\n{body}\n```\n")
    }

    #[test]
    fn pass_and_rework_parse() {
        assert_eq!(parse(&block(r#"{"verdict":"pass"}"#)), Ok(Verdict::Pass));
        let v = parse(&block(
            r#"{"verdict":"rework","defects":[{"file":"src/a.rs","line":3,"issue":"off by one"}]}"#,
        ))
        .unwrap();
        assert_eq!(v.defects().len(), 1);
        assert_eq!(v.defects()[0].line, Some(3));
    }

    #[test]
    fn anything_else_is_not_a_verdict() {
        for answer in [
            "looks good to me".to_string(),
            block(r#"{"verdict":"maybe"}"#),
            block(r#"{"verdict":"pass","extra":1}"#),
            block(r#"{"verdict":"rework","defects":[]}"#),
            block(r#"{"verdict":"rework"}"#),
            block(r#"{"verdict":"pass","defects":[{"file":"a","issue":"x"}]}"#),
            block(r#"{"verdict":"rework","defects":[{"file":"../etc/passwd","issue":"x"}]}"#),
            block(r#"{"verdict":"rework","defects":[{"file":"/abs","issue":"x"}]}"#),
            block(r#"{"verdict":"rework","defects":[{"file":"a","issue":""}]}"#),
            format!(
                "{}{}",
                block(r#"{"verdict":"pass"}"#),
                block(r#"{"verdict":"pass"}"#)
            ),
            format!("```{FENCE_TAG}\n{{\"verdict\":\"pass\"}}\n"),
        ] {
            assert!(parse(&answer).is_err(), "{answer}");
        }
        let many: Vec<String> = (0..51)
            .map(|i| format!(r#"{{"file":"f{i}","issue":"x"}}"#))
            .collect();
        assert!(
            parse(&block(&format!(
                r#"{{"verdict":"rework","defects":[{}]}}"#,
                many.join(",")
            )))
            .is_err()
        );
    }
}
