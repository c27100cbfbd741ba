//! The plugin manifest `omniconflux-plugin.json`, the checks of a plugin's
//! folder, and the snapshot hash that approvals name (seed 000: the manifest
//! members of plugin.get's `diff` field list, with their bounds from
//! initialize, plugin.list, plugin.approve and plugin.commands; plugin-invalid
//! "The message is the problem code of the first failed check, then what
//! failed and where"; `snapshotHash` of plugin.install and plugin.approve).
//!
//! The page names the members and bounds but not the problem codes nor the
//! hash's byte form; both are defined here and are a contract from now on.
//! This is the only file of the plugin host that touches the filesystem, with
//! `std::fs` alone.
//!
//! # Manifest
//!
//! A JSON object with exactly these members ([`Manifest::parse`]):
//! `manifestVersion` (the integer 1), `api` (`^[1-9][0-9]{0,3}\.(?:0|[1-9][0-9]{0,3})$`),
//! `id` (3 to 64 characters, `^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$`), `name` (1 to
//! 48 characters), `version` (1 to 64 characters), `description` (at most 200
//! characters), `publisher` (optional, 1 to 64 characters), `main` (a relative
//! path below the folder, at most 256 characters, segments of
//! `[A-Za-z0-9_.@+-]` that are not `.` or `..`), `permissions` (at most 5, no
//! repeats, of the permission table) and `commands` (optional, at most 8 with
//! unique ids: `id` at most 32 characters of the command pattern, `title` 1
//! to 48 characters, `description` optional string or null of at most 120,
//! `input` optional `none` or `text`, default `none`). Text members hold no
//! control or invisible formatting character (Cc, Cf, Zl, Zp), so the approval
//! prompt shows exactly what the plugin says. Decisions where the page is
//! silent: the bounds of `name` (the 48 of plugin.commands' pluginName),
//! `main`, and the rule that commands need the `commands.add` permission.
//!
//! # Folder checks and their problem codes, in the order they run
//!
//! 1. `folder-unreadable`: the folder is not a directory, or reading it
//!    failed.
//! 2. `manifest-missing`: no regular file `omniconflux-plugin.json` at the
//!    top (a link there does not count).
//! 3. `manifest-invalid`: larger than 64 KiB, not UTF-8 JSON, or not of the
//!    shape above.
//! 4. `too-many-files`: more than 2,000 entries (files, folders, links).
//! 5. `name-invalid`: a name that is not UTF-8 or holds a control or
//!    invisible character (it would show wrongly in the approval diff).
//! 6. `special-file`: a FIFO, socket or device.
//! 7. `link-outside`: a symbolic link that does not resolve to something
//!    inside the folder (dangling and looping links included).
//! 8. `file-too-large`: a regular file over 32 MiB.
//! 9. `folder-too-large`: regular files over 128 MiB together.
//! 10. `main-missing`: `main` is not a regular file (after links).
//! 11. `main-outside`: `main` resolves outside the folder.
//!
//! # Snapshot hash
//!
//! SHA-256, as lowercase hex, over this listing of every regular file and
//! symbolic link below the folder (folders themselves are not listed), sorted
//! by the bytes of the relative path (`/` between segments, UTF-8). For each
//! entry, one record:
//!
//! ```text
//! <path bytes> NUL <mode: 6 octal digits> NUL <content length: decimal> NUL <content SHA-256: 64 lowercase hex> LF
//! ```
//!
//! The mode is normalised as git does, so a copy made under another umask
//! hashes the same while an executable bit still counts: `100755` for a
//! regular file with any execute bit, `100644` for any other regular file,
//! `120000` for a link, whose content is its target's bytes as written in the
//! link. Links are listed because changing where one points changes what
//! runs.

use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::text;
use super::wire::{Permission, RUNNABLE_APIS, is_api_version};
use crate::ids::hex;
use crate::limits;

/// The manifest's file name, at the top of the plugin's folder.
pub const MANIFEST_FILE: &str = "omniconflux-plugin.json";

/// Every member a manifest may have, in the page's order (seed 000,
/// "Manifest"), which is also the order of plugin.get's diff fields.
pub const MEMBERS: [&str; 10] = [
    "manifestVersion",
    "api",
    "id",
    "name",
    "version",
    "description",
    "publisher",
    "main",
    "permissions",
    "commands",
];

/// Whether a command takes the operator's line of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandInput {
    /// `none`: command.run carries no input.
    None,
    /// `text`: command.run carries the line the operator typed.
    Text,
}

/// One command of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The command's id inside the plugin.
    pub id: String,
    /// What the app shows.
    pub title: String,
    /// A longer line, or none.
    pub description: Option<String>,
    /// Whether it takes input.
    pub input: CommandInput,
}

/// A manifest that fits its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The API version the plugin was built for.
    pub api: String,
    /// The plugin id.
    pub id: String,
    /// The display name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// What it does.
    pub description: String,
    /// Who publishes it.
    pub publisher: Option<String>,
    /// The entry file, relative to the folder.
    pub main: String,
    /// The permissions it asks for, in the manifest's order.
    pub permissions: Vec<Permission>,
    /// Its commands, in the manifest's order.
    pub commands: Vec<Command>,
}

/// A problem code of the folder and manifest checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemCode {
    /// `folder-unreadable`
    FolderUnreadable,
    /// `manifest-missing`
    ManifestMissing,
    /// `manifest-invalid`
    ManifestInvalid,
    /// `too-many-files`
    TooManyFiles,
    /// `name-invalid`
    NameInvalid,
    /// `special-file`
    SpecialFile,
    /// `link-outside`
    LinkOutside,
    /// `file-too-large`
    FileTooLarge,
    /// `folder-too-large`
    FolderTooLarge,
    /// `main-missing`
    MainMissing,
    /// `main-outside`
    MainOutside,
}

impl ProblemCode {
    /// The code as plugin-invalid's message starts with it.
    pub fn name(self) -> &'static str {
        match self {
            ProblemCode::FolderUnreadable => "folder-unreadable",
            ProblemCode::ManifestMissing => "manifest-missing",
            ProblemCode::ManifestInvalid => "manifest-invalid",
            ProblemCode::TooManyFiles => "too-many-files",
            ProblemCode::NameInvalid => "name-invalid",
            ProblemCode::SpecialFile => "special-file",
            ProblemCode::LinkOutside => "link-outside",
            ProblemCode::FileTooLarge => "file-too-large",
            ProblemCode::FolderTooLarge => "folder-too-large",
            ProblemCode::MainMissing => "main-missing",
            ProblemCode::MainOutside => "main-outside",
        }
    }
}

/// The first failed check: its code, and what failed and where (relative
/// paths only, already clean).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The problem code.
    pub code: ProblemCode,
    /// What failed and where.
    pub detail: String,
}

impl Problem {
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Problem {
        Problem {
            code,
            detail: detail.into(),
        }
    }

    /// plugin-invalid's message: the code, then what failed and where, one
    /// clean line of at most 500 characters.
    pub fn message(&self) -> String {
        text::cut_chars(
            &text::clean_line(&format!("{}: {}", self.code.name(), self.detail)),
            limits::PLUGIN_ERROR_MESSAGE_MAX,
        )
        .to_string()
    }
}

fn invalid(detail: impl Into<String>) -> Problem {
    Problem::new(ProblemCode::ManifestInvalid, detail)
}

/// `^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$`: a plugin id or command id (without
/// their length bounds).
pub fn is_kebab_id(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && s.split('-').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// A plugin id: 3 to 64 characters of the id pattern.
pub fn is_plugin_id(s: &str) -> bool {
    (limits::PLUGIN_ID_MIN..=limits::PLUGIN_ID_MAX).contains(&s.len()) && is_kebab_id(s)
}

/// A command id: at most 32 characters of the id pattern.
pub fn is_command_id(s: &str) -> bool {
    s.len() <= limits::PLUGIN_COMMAND_ID_MAX && is_kebab_id(s)
}

/// A manifest `main`: a relative path below the folder.
pub fn is_main_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= limits::PLUGIN_MAIN_MAX
        && s.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'+' | b'-')
                })
        })
}

fn text_member(
    o: &Map<String, Value>,
    name: &str,
    min: usize,
    max: usize,
) -> Result<Option<String>, Problem> {
    match o.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => {
            let n = s.chars().count();
            if n < min || n > max || !text::is_plain(s) {
                Err(invalid(format!(
                    "{name} must be {min} to {max} characters without control or invisible characters"
                )))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(_) => Err(invalid(format!("{name} must be a string"))),
    }
}

fn required(v: Option<String>, name: &str) -> Result<String, Problem> {
    v.ok_or_else(|| invalid(format!("{name} is required")))
}

fn reject_unknown(o: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), Problem> {
    match o.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) if is_kebab_id(k) || k.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            Err(invalid(format!("{what} has an unknown member: {k}")))
        }
        Some(_) => Err(invalid(format!("{what} has an unknown member"))),
        None => Ok(()),
    }
}

impl Manifest {
    /// Parses and checks the manifest file's bytes against its schema.
    /// Every failure is `manifest-invalid`.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, Problem> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|_| invalid("the file is not UTF-8 JSON"))?;
        let Value::Object(o) = value else {
            return Err(invalid("the file is not a JSON object"));
        };
        reject_unknown(&o, &MEMBERS, "the manifest")?;
        if o.get("manifestVersion").and_then(Value::as_u64) != Some(1) {
            return Err(invalid("manifestVersion must be 1"));
        }
        let api = match o.get("api") {
            Some(Value::String(a)) if is_api_version(a) => a.clone(),
            _ => return Err(invalid("api must be an API version such as 1.0")),
        };
        let id = match o.get("id") {
            Some(Value::String(i)) if is_plugin_id(i) => i.clone(),
            _ => {
                return Err(invalid(
                    "id must be 3 to 64 lowercase letters, digits and single hyphens, starting with a letter",
                ));
            }
        };
        let name = required(text_member(&o, "name", 1, limits::PLUGIN_NAME_MAX)?, "name")?;
        let version = required(
            text_member(&o, "version", 1, limits::PLUGIN_VERSION_MAX)?,
            "version",
        )?;
        let description = required(
            text_member(&o, "description", 0, limits::PLUGIN_DESCRIPTION_MAX)?,
            "description",
        )?;
        let publisher = text_member(&o, "publisher", 1, limits::PLUGIN_PUBLISHER_MAX)?;
        let main = match o.get("main") {
            Some(Value::String(m)) if is_main_path(m) => m.clone(),
            _ => {
                return Err(invalid(
                    "main must be a relative path inside the folder of at most 256 characters",
                ));
            }
        };
        let permissions = match o.get("permissions") {
            Some(Value::Array(items)) if items.len() <= Permission::ALL.len() => {
                let mut v = Vec::new();
                for item in items {
                    let p = item
                        .as_str()
                        .and_then(Permission::from_name)
                        .ok_or_else(|| {
                            invalid("permissions holds an item that is not a permission")
                        })?;
                    if v.contains(&p) {
                        return Err(invalid("permissions holds an item twice"));
                    }
                    v.push(p);
                }
                v
            }
            Some(Value::Array(_)) => return Err(invalid("permissions must be at most 5 items")),
            _ => return Err(invalid("permissions must be an array")),
        };
        let commands = match o.get("commands") {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() <= limits::PLUGIN_COMMANDS_MAX => {
                let mut v: Vec<Command> = Vec::new();
                for item in items {
                    let c = parse_command(item)?;
                    if v.iter().any(|x| x.id == c.id) {
                        return Err(invalid("commands holds an id twice"));
                    }
                    v.push(c);
                }
                v
            }
            Some(Value::Array(_)) => return Err(invalid("commands must be at most 8 items")),
            Some(_) => return Err(invalid("commands must be an array")),
        };
        if !commands.is_empty() && !permissions.contains(&Permission::CommandsAdd) {
            return Err(invalid("commands need the permission commands.add"));
        }
        Ok(Manifest {
            api,
            id,
            name,
            version,
            description,
            publisher,
            main,
            permissions,
            commands,
        })
    }

    /// True when this host runs the manifest's api (else plugin-incompatible).
    pub fn is_runnable(&self) -> bool {
        RUNNABLE_APIS.contains(&self.api.as_str())
    }

    /// The permissions in the order of the permission table.
    pub fn permissions_in_table_order(&self) -> Vec<Permission> {
        Permission::table_order(&self.permissions)
    }
}

fn parse_command(item: &Value) -> Result<Command, Problem> {
    let Value::Object(o) = item else {
        return Err(invalid("commands holds an item that is not an object"));
    };
    reject_unknown(o, &["id", "title", "description", "input"], "a command")?;
    let id = match o.get("id") {
        Some(Value::String(i)) if is_command_id(i) => i.clone(),
        _ => {
            return Err(invalid(
                "commands[].id must be at most 32 lowercase letters, digits and single hyphens",
            ));
        }
    };
    let title = required(
        text_member(o, "title", 1, limits::PLUGIN_COMMAND_TITLE_MAX)?,
        "commands[].title",
    )?;
    let description = match o.get("description") {
        Some(Value::Null) => None,
        _ => text_member(o, "description", 0, limits::PLUGIN_COMMAND_DESCRIPTION_MAX)?,
    };
    let input = match o.get("input").map(Value::as_str) {
        None | Some(Some("none")) => CommandInput::None,
        Some(Some("text")) => CommandInput::Text,
        Some(_) => return Err(invalid("commands[].input must be none or text")),
    };
    Ok(Command {
        id,
        title,
        description,
        input,
    })
}

/// One listed entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Relative path, `/` between segments.
    pub path: String,
    /// `0o100644`, `0o100755` or `0o120000`.
    pub mode: u32,
    /// Content length in bytes (a link's target length).
    pub size: u64,
    /// SHA-256 of the content (a link's target bytes).
    pub sha256: [u8; 32],
}

/// A folder that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The manifest.
    pub manifest: Manifest,
    /// Every regular file and link, sorted by path bytes.
    pub entries: Vec<SnapshotEntry>,
    /// Regular files, as plugin.get's `files.count`.
    pub file_count: u64,
    /// Their bytes, as plugin.get's `files.bytes`.
    pub file_bytes: u64,
    /// The snapshot hash, 64 lowercase hex.
    pub hash: String,
}

/// The snapshot hash of `entries` in the byte form of the module comment;
/// `entries` need not be sorted.
pub fn snapshot_hash(entries: &[SnapshotEntry]) -> String {
    let mut sorted: Vec<&SnapshotEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for e in sorted {
        ctx.update(e.path.as_bytes());
        ctx.update(format!("\0{:06o}\0{}\0{}\n", e.mode, e.size, hex(&e.sha256)).as_bytes());
    }
    hex(ctx.finish().as_ref())
}

fn sha256_of(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

fn unreadable(what: &str) -> Problem {
    Problem::new(ProblemCode::FolderUnreadable, what)
}

/// Hashes a regular file, reading at most one byte more than the file limit
/// so a file that grows while it is read is still refused.
fn hash_file(path: &Path, rel: &str) -> Result<(u64, [u8; 32]), Problem> {
    let file = fs::File::open(path).map_err(|_| unreadable(&format!("{rel} cannot be read")))?;
    let mut reader = file.take(limits::PLUGIN_FILE_MAX_BYTES + 1);
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|_| unreadable(&format!("{rel} cannot be read")))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        ctx.update(&buf[..n]);
    }
    if size > limits::PLUGIN_FILE_MAX_BYTES {
        return Err(Problem::new(
            ProblemCode::FileTooLarge,
            format!("{rel} is larger than 32 MiB"),
        ));
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok((size, out))
}

#[cfg(unix)]
fn is_executable(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &fs::Metadata) -> bool {
    false
}

#[cfg(unix)]
fn link_target_bytes(target: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    target.as_os_str().as_bytes().to_vec()
}

#[cfg(not(unix))]
fn link_target_bytes(target: &Path) -> Vec<u8> {
    target.to_string_lossy().into_owned().into_bytes()
}

/// Runs every check of the module comment on the folder at `root`, in order,
/// and returns the snapshot, or the first problem.
pub fn check_folder(root: &Path) -> Result<Snapshot, Problem> {
    let root = fs::canonicalize(root).map_err(|_| unreadable("the folder cannot be opened"))?;
    if !fs::metadata(&root).map(|m| m.is_dir()).unwrap_or(false) {
        return Err(unreadable("the path is not a folder"));
    }

    let manifest_path = root.join(MANIFEST_FILE);
    match fs::symlink_metadata(&manifest_path) {
        Ok(m) if m.is_file() => {
            if m.len() > limits::PLUGIN_MANIFEST_MAX_BYTES {
                return Err(invalid(format!("{MANIFEST_FILE} is larger than 64 KiB")));
            }
        }
        _ => {
            return Err(Problem::new(
                ProblemCode::ManifestMissing,
                format!("{MANIFEST_FILE} is not a file at the top of the folder"),
            ));
        }
    }
    let bytes = fs::read(&manifest_path)
        .map_err(|_| unreadable(&format!("{MANIFEST_FILE} cannot be read")))?;
    let manifest = Manifest::parse(&bytes)?;

    let mut entries = Vec::new();
    let mut file_count = 0u64;
    let mut file_bytes = 0u64;
    let mut seen = 0usize;
    let mut dirs: Vec<(PathBuf, String)> = vec![(root.clone(), String::new())];
    while let Some((dir, prefix)) = dirs.pop() {
        let read = fs::read_dir(&dir)
            .map_err(|_| unreadable(&format!("{} cannot be listed", shown(&prefix))))?;
        for item in read {
            let item =
                item.map_err(|_| unreadable(&format!("{} cannot be listed", shown(&prefix))))?;
            seen += 1;
            if seen > limits::PLUGIN_FOLDER_MAX_ENTRIES {
                return Err(Problem::new(
                    ProblemCode::TooManyFiles,
                    "the folder holds more than 2000 entries",
                ));
            }
            let name = item.file_name();
            let name = match name.to_str() {
                Some(n) if text::is_plain(n) => n.to_string(),
                _ => {
                    return Err(Problem::new(
                        ProblemCode::NameInvalid,
                        format!("a name in {} is not plain UTF-8", shown(&prefix)),
                    ));
                }
            };
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let path = item.path();
            let meta = fs::symlink_metadata(&path)
                .map_err(|_| unreadable(&format!("{rel} cannot be read")))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                dirs.push((path, rel));
            } else if kind.is_symlink() {
                let inside = fs::canonicalize(&path)
                    .map(|t| t.starts_with(&root))
                    .unwrap_or(false);
                if !inside {
                    return Err(Problem::new(
                        ProblemCode::LinkOutside,
                        format!("{rel} does not resolve inside the folder"),
                    ));
                }
                let target = fs::read_link(&path)
                    .map_err(|_| unreadable(&format!("{rel} cannot be read")))?;
                let target = link_target_bytes(&target);
                entries.push(SnapshotEntry {
                    path: rel,
                    mode: 0o120000,
                    size: target.len() as u64,
                    sha256: sha256_of(&target),
                });
            } else if kind.is_file() {
                if meta.len() > limits::PLUGIN_FILE_MAX_BYTES {
                    return Err(Problem::new(
                        ProblemCode::FileTooLarge,
                        format!("{rel} is larger than 32 MiB"),
                    ));
                }
                let (size, sha256) = hash_file(&path, &rel)?;
                file_count += 1;
                file_bytes += size;
                if file_bytes > limits::PLUGIN_FOLDER_MAX_BYTES {
                    return Err(Problem::new(
                        ProblemCode::FolderTooLarge,
                        "the files hold more than 128 MiB together",
                    ));
                }
                let mode = if is_executable(&meta) {
                    0o100755
                } else {
                    0o100644
                };
                entries.push(SnapshotEntry {
                    path: rel,
                    mode,
                    size,
                    sha256,
                });
            } else {
                return Err(Problem::new(
                    ProblemCode::SpecialFile,
                    format!("{rel} is not a file, folder or link"),
                ));
            }
        }
    }

    // main: the manifest's pattern already refuses `..` and absolute paths;
    // links are what can still lead out.
    let main_path = root.join(Path::new(&manifest.main));
    debug_assert!(
        main_path
            .components()
            .all(|c| !matches!(c, Component::ParentDir))
    );
    match fs::canonicalize(&main_path) {
        Ok(real) if !real.starts_with(&root) => {
            return Err(Problem::new(
                ProblemCode::MainOutside,
                format!("main {} resolves outside the folder", manifest.main),
            ));
        }
        Ok(real) if fs::metadata(&real).map(|m| m.is_file()).unwrap_or(false) => {}
        _ => {
            return Err(Problem::new(
                ProblemCode::MainMissing,
                format!("main {} is not a file in the folder", manifest.main),
            ));
        }
    }

    entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let hash = snapshot_hash(&entries);
    Ok(Snapshot {
        manifest,
        entries,
        file_count,
        file_bytes,
        hash,
    })
}

fn shown(prefix: &str) -> &str {
    if prefix.is_empty() {
        "the top of the folder"
    } else {
        prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn example() -> Value {
        json!({
            "manifestVersion": 1,
            "api": "1.0",
            "id": "night-shift",
            "name": "Night Shift",
            "version": "1.2.0",
            "description": "Starts a follow-up task when a lane is verified.",
            "main": "dist/main.mjs",
            "permissions": ["events.read", "storage.own"]
        })
    }

    fn parse(v: &Value) -> Result<Manifest, Problem> {
        Manifest::parse(serde_json::to_string(v).unwrap_or_default().as_bytes())
    }

    fn with(member: &str, value: Value) -> Value {
        let mut m = example();
        m[member] = value;
        m
    }

    #[test]
    fn page_example_parses() {
        let m = parse(&example()).unwrap();
        assert_eq!(m.id, "night-shift");
        assert_eq!(
            m.permissions,
            vec![Permission::EventsRead, Permission::StorageOwn]
        );
        assert!(m.is_runnable());
        assert!(m.commands.is_empty() && m.publisher.is_none());
        let m = parse(&with("api", json!("1.1"))).unwrap();
        assert!(m.is_runnable());
        assert!(!parse(&with("api", json!("2.0"))).unwrap().is_runnable());
        let m = parse(&with("permissions", json!(["tasks.create", "events.read"]))).unwrap();
        assert_eq!(
            m.permissions_in_table_order(),
            vec![Permission::EventsRead, Permission::TasksCreate]
        );
    }

    #[test]
    fn commands() {
        let mut v = with("permissions", json!(["commands.add"]));
        v["commands"] = json!([
            {"id": "summary", "title": "Show tonight's summary", "description": "Lists the lanes verified since the last run.", "input": "none"},
            {"id": "note", "title": "Add a note", "description": null, "input": "text"},
            {"id": "x", "title": "X"}
        ]);
        let m = parse(&v).unwrap();
        assert_eq!(m.commands.len(), 3);
        assert_eq!(m.commands[1].input, CommandInput::Text);
        assert_eq!(m.commands[2].input, CommandInput::None);
        assert_eq!(m.commands[1].description, None);
        let mut no_perm = v.clone();
        no_perm["permissions"] = json!([]);
        assert!(parse(&no_perm).unwrap_err().detail.contains("commands.add"));
        for bad in [
            json!([{"id": "Note", "title": "t"}]),
            json!([{"id": "a".repeat(33), "title": "t"}]),
            json!([{"id": "n", "title": ""}]),
            json!([{"id": "n", "title": "x".repeat(49)}]),
            json!([{"id": "n", "title": "t", "input": "file"}]),
            json!([{"id": "n", "title": "t", "run": "x"}]),
            json!([{"id": "n", "title": "t", "description": "d".repeat(121)}]),
            json!([{"id": "n", "title": "t"}, {"id": "n", "title": "u"}]),
            json!(
                (0..9)
                    .map(|i| json!({"id": format!("c{i}"), "title": "t"}))
                    .collect::<Vec<_>>()
            ),
            json!({}),
        ] {
            let mut m = v.clone();
            m["commands"] = bad.clone();
            assert_eq!(
                parse(&m).unwrap_err().code,
                ProblemCode::ManifestInvalid,
                "{bad}"
            );
        }
    }

    #[test]
    fn invalid_manifests() {
        let cases = [
            with("manifestVersion", json!(2)),
            with("manifestVersion", json!(1.0)),
            with("manifestVersion", json!("1")),
            with("api", json!("1")),
            with("id", json!("ns")),
            with("id", json!("Night-Shift")),
            with("id", json!("night--shift")),
            with("id", json!("x".repeat(65))),
            with("name", json!("")),
            with("name", json!("x".repeat(49))),
            with("name", json!("Night\u{202e}Shift")),
            with("version", json!("x".repeat(65))),
            with("description", json!("d".repeat(201))),
            with("description", json!("two\nlines")),
            with("publisher", json!("")),
            with("publisher", json!(null)),
            with("main", json!("../main.mjs")),
            with("main", json!("/abs/main.mjs")),
            with("main", json!("dist//main.mjs")),
            with("main", json!("dist/./main.mjs")),
            with("main", json!("dist\\main.mjs")),
            with("main", json!("x".repeat(257))),
            with("permissions", json!(["events.read", "events.read"])),
            with("permissions", json!(["root"])),
            with("permissions", json!("events.read")),
            with("extra", json!(true)),
            json!([]),
        ];
        for c in cases {
            assert_eq!(
                parse(&c).unwrap_err().code,
                ProblemCode::ManifestInvalid,
                "{c}"
            );
        }
        let mut m = example();
        m.as_object_mut().unwrap().remove("permissions");
        assert!(parse(&m).is_err());
        assert_eq!(
            Manifest::parse(b"\xff{").unwrap_err().code,
            ProblemCode::ManifestInvalid
        );
        assert_eq!(invalid("x\ny").message(), "manifest-invalid: x y");
    }

    #[test]
    fn snapshot_hash_fixed_vector() {
        // Computed independently (Python hashlib) from the byte form of the
        // module comment.
        let e = |path: &str, mode: u32, content: &[u8]| SnapshotEntry {
            path: path.into(),
            mode,
            size: content.len() as u64,
            sha256: sha256_of(content),
        };
        let entries = [
            e("link", 0o120000, b"a.txt"),
            e("bin/run", 0o100755, b"#!/bin/sh\n"),
            e("a.txt", 0o100644, b"hello\n"),
        ];
        assert_eq!(
            snapshot_hash(&entries),
            "1e40342177b82739994f77d49c3d51a9486574f0f6236ad764f3980dbf960a84"
        );
        assert_eq!(
            snapshot_hash(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "omni-manifest-{tag}-{}-{}",
                std::process::id(),
                crate::ids::secret_hex(6)
            ));
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn write(&self, rel: &str, content: &[u8]) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn plugin(tag: &str) -> TempDir {
        let d = TempDir::new(tag);
        d.write(
            MANIFEST_FILE,
            serde_json::to_string(&example()).unwrap().as_bytes(),
        );
        d.write("dist/main.mjs", b"export default 1;\n");
        d
    }

    #[cfg(unix)]
    #[test]
    fn folder_checks() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let d = plugin("ok");
        let s = check_folder(&d.0).unwrap();
        assert_eq!(s.file_count, 2);
        assert_eq!(
            s.entries
                .iter()
                .map(|e| e.path.as_str())
                .collect::<Vec<_>>(),
            vec!["dist/main.mjs", MANIFEST_FILE]
        );
        let h = s.hash.clone();
        assert_eq!(h.len(), 64);
        assert_eq!(check_folder(&d.0).unwrap().hash, h);
        // An executable bit, a link and a content change each change it.
        fs::set_permissions(d.0.join("dist/main.mjs"), fs::Permissions::from_mode(0o755)).unwrap();
        let h2 = check_folder(&d.0).unwrap().hash;
        assert_ne!(h2, h);
        symlink("main.mjs", d.0.join("dist/alias.mjs")).unwrap();
        let s3 = check_folder(&d.0).unwrap();
        assert_ne!(s3.hash, h2);
        assert_eq!(s3.entries[0].mode, 0o120000);
        d.write("dist/main.mjs", b"export default 2;\n");
        assert_ne!(check_folder(&d.0).unwrap().hash, s3.hash);

        let d = plugin("link-out");
        symlink("/etc/passwd", d.0.join("passwd")).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::LinkOutside
        );
        let d = plugin("link-up");
        symlink("../..", d.0.join("dist/up")).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::LinkOutside
        );
        let d = plugin("dangling");
        symlink("nowhere", d.0.join("dangling")).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::LinkOutside
        );

        let d = TempDir::new("missing");
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::ManifestMissing
        );
        let d = TempDir::new("bad-json");
        d.write(MANIFEST_FILE, b"{");
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::ManifestInvalid
        );
        let d = TempDir::new("big-manifest");
        d.write(MANIFEST_FILE, &vec![b' '; 70_000]);
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::ManifestInvalid
        );
        let d = TempDir::new("link-manifest");
        d.write(
            "real.json",
            serde_json::to_string(&example()).unwrap().as_bytes(),
        );
        symlink("real.json", d.0.join(MANIFEST_FILE)).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::ManifestMissing
        );

        let d = TempDir::new("no-main");
        d.write(
            MANIFEST_FILE,
            serde_json::to_string(&example()).unwrap().as_bytes(),
        );
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::MainMissing
        );
        fs::create_dir_all(d.0.join("dist/main.mjs")).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::MainMissing
        );

        // main through a link that leaves: the link check comes first.
        let outside = TempDir::new("outside");
        outside.write("main.mjs", b"evil");
        let d = TempDir::new("main-out");
        d.write(
            MANIFEST_FILE,
            serde_json::to_string(&example()).unwrap().as_bytes(),
        );
        symlink(&outside.0, d.0.join("dist")).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::LinkOutside
        );

        let d = plugin("many");
        for i in 0..limits::PLUGIN_FOLDER_MAX_ENTRIES {
            d.write(&format!("f/{i}"), b"");
        }
        let p = check_folder(&d.0).unwrap_err();
        assert_eq!(p.code, ProblemCode::TooManyFiles);
        assert!(p.message().starts_with("too-many-files: "));

        let d = plugin("large");
        let f = fs::File::create(d.0.join("big.bin")).unwrap();
        f.set_len(limits::PLUGIN_FILE_MAX_BYTES + 1).unwrap();
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::FileTooLarge
        );

        let d = plugin("name");
        d.write("bad\u{202e}name.js", b"");
        assert_eq!(
            check_folder(&d.0).unwrap_err().code,
            ProblemCode::NameInvalid
        );

        assert_eq!(
            check_folder(&d.0.join("absent")).unwrap_err().code,
            ProblemCode::FolderUnreadable
        );
    }
}
