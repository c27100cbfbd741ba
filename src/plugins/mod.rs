//! The plugin host (seed 000, issue 4).
//!
//! - [`text`]: the character classes of the page and the cleaning of plugin
//!   text before a client sees it.
//! - [`wire`]: the four message shapes, the host's error object, and every
//!   line the host writes.
//! - [`calls`]: the typed params of every call a plugin makes, and their
//!   results (API 1.0 and the 1.1 additions).
//! - [`manifest`]: `omniconflux-plugin.json`, the folder checks and the
//!   snapshot hash.
//! - [`store`]: the installed copies and `plugins.json` under the state
//!   directory.
//! - [`process`]: how a plugin process is started, isolated and watched.
//! - [`host`]: every plugin's run, the wire exchange, limits and faults.
//! - [`effects`]: what the host asks of the daemon and reads of it.
//! - [`tasks`]: tasks.create, tasks.cancel and plugin.request.get, and
//!   their requests' place in the daemon's approvals inbox.
//! - [`views`]: what the host reads of sessions, seats and lanes.

pub mod calls;
pub mod effects;
pub mod host;
pub mod manifest;
pub mod process;
pub mod store;
pub mod tasks;
pub mod text;
pub mod views;
pub mod wire;

#[cfg(test)]
mod schema_tests {
    //! The JSON Schemas in `vendor-schemas/plugin-api-1.x/` are written from
    //! the same page; these tests prove each file parses, that every `$ref`
    //! lands on a file and definition that exist, and that the lists the
    //! schemas and the Rust code both spell (calls, kinds, permissions, error
    //! codes) agree.

    use super::wire::{
        EventKind, HostError, HostErrorKind, Method, PendingState, Permission, QuotaLimit,
    };
    use serde_json::Value;
    use std::path::{Path, PathBuf};

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("vendor-schemas/plugin-api-1.x")
    }

    fn load(rel: &str) -> Value {
        let text =
            std::fs::read_to_string(dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn files(d: &Path, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(d).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let rel = format!("{prefix}{name}");
            if entry.file_type().unwrap().is_dir() {
                files(&entry.path(), &format!("{rel}/"), out);
            } else {
                out.push(rel);
            }
        }
    }

    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    if k == "$ref" {
                        out.push(x.as_str().unwrap().to_string());
                    }
                    refs(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    fn enum_of(v: &Value) -> Vec<String> {
        v["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn every_schema_parses_and_every_ref_resolves() {
        let mut all = Vec::new();
        files(&dir(), "", &mut all);
        assert!(all.len() >= 22);
        for rel in &all {
            assert!(rel.ends_with(".schema.json"), "{rel}");
            let doc = load(rel);
            assert_eq!(
                doc["$schema"], "https://json-schema.org/draft/2020-12/schema",
                "{rel}"
            );
            let mut rs = Vec::new();
            refs(&doc, &mut rs);
            for r in rs {
                let (file, pointer) = r.split_once('#').unwrap_or((r.as_str(), ""));
                let target = if file.is_empty() {
                    doc.clone()
                } else {
                    let base = Path::new(rel).parent().unwrap_or(Path::new(""));
                    let joined = base.join(file);
                    let norm: PathBuf = joined.components().fold(PathBuf::new(), |mut p, c| {
                        match c {
                            std::path::Component::ParentDir => {
                                p.pop();
                            }
                            other => p.push(other),
                        }
                        p
                    });
                    load(norm.to_str().unwrap())
                };
                assert!(target.pointer(pointer).is_some(), "{rel}: {r}");
            }
        }
    }

    #[test]
    fn schemas_agree_with_the_code() {
        for m in Method::ALL {
            let doc = load(&format!("calls/{}.schema.json", m.name()));
            assert!(
                doc["$defs"]["params"].is_object() && doc["$defs"]["result"].is_object(),
                "{}",
                m.name()
            );
            assert!(
                doc["description"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("Permission: {}.", m.permission().name()))
            );
        }
        for host in ["initialize", "ping", "command.run", "shutdown"] {
            assert!(load(&format!("calls/{host}.schema.json"))["$defs"]["params"].is_object());
        }
        let defs = load("defs.schema.json");
        let kinds: Vec<String> = EventKind::ALL
            .iter()
            .map(|k| k.name().to_string())
            .collect();
        assert_eq!(enum_of(&defs["$defs"]["eventKind"]), kinds);
        let perms: Vec<String> = Permission::ALL
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        assert_eq!(enum_of(&defs["$defs"]["permission"]), perms);
        let events = load("event.schema.json");
        for k in EventKind::ALL {
            let subject = if k.is_lane() { "lane" } else { "session" };
            assert!(
                events["$defs"][k.name()]["properties"][subject].is_object(),
                "{}",
                k.name()
            );
        }
        let codes: Vec<String> = [
            HostErrorKind::InvalidRequest,
            HostErrorKind::MethodNotFound,
            HostErrorKind::InvalidParams,
            HostErrorKind::PermissionDenied(Permission::EventsRead),
            HostErrorKind::NotInitialized,
            HostErrorKind::Busy,
            HostErrorKind::RateLimited,
            HostErrorKind::ResultTooLarge,
            HostErrorKind::QuotaExceeded(QuotaLimit::Keys),
            HostErrorKind::TooManyPending,
            HostErrorKind::ApprovalDenied,
            HostErrorKind::ApprovalExpired,
            HostErrorKind::TaskRefused("isolation-missing".into()),
            HostErrorKind::Unavailable,
            HostErrorKind::ShuttingDown,
            HostErrorKind::InternalError,
            HostErrorKind::RequestCancelled,
            HostErrorKind::NotPending(PendingState::Answered),
            HostErrorKind::NotFound,
        ]
        .into_iter()
        .map(|k| HostError::of(k).code().to_string())
        .collect();
        assert_eq!(
            enum_of(&load("host-error.schema.json")["properties"]["code"]),
            codes
        );
        let manifest = load("manifest.schema.json");
        let members: Vec<&str> = manifest["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for m in super::manifest::MEMBERS {
            assert!(members.contains(&m), "{m}");
        }
    }
}
