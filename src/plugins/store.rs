//! The plugin store under the state directory: the installed copies, the
//! plugins' own working directories, and `plugins.json`, the host's record of
//! every plugin (seed 000, "Daemon methods that manage plugins").
//!
//! Layout, all private to the daemon's user (0700):
//!
//! ```text
//! <state>/plugins/plugins.json      every plugin's record, written atomically
//! <state>/plugins/store.key         32 random bytes: the key of the approval checks
//! <state>/plugins/<id>/approved/    the copy the operator approved (it runs)
//! <state>/plugins/<id>/waiting/     the copy that waits for approval
//! <state>/plugins/<id>/work/        the plugin's own working directory
//! <state>/plugins/.staging-<hex>/   a copy being made by plugin.install
//! <state>/plugins/.retired-<hex>/   a copy replaced, being deleted
//! ```
//!
//! `plugins.json` is written to a temporary file, fsynced, renamed over the
//! old one, and the directory fsynced, so a crash leaves the old or the new
//! record, never a mix.
//!
//! The reactor never waits for that (DESIGN.md, "Threads and ownership":
//! anything that fsyncs outside the ledger runs on its own thread): the
//! records are written by the `plugin-records` thread, which also syncs
//! the plugin folders that renames on the reactor changed, before the
//! record that names them; the copying and hashing of plugin.install, and
//! the deletion of the copies installs and approvals replace, run on the
//! `plugin-install` thread. Each is a [`Worker`]: one thread,
//! a bounded queue, jobs run in the order they were queued; the host
//! (`super::host`) keeps the bookkeeping of what waits for them.
//!
//! Decisions where the page is silent:
//! - The approval's integrity check is an HMAC-SHA256, keyed with
//!   `store.key`, over the plugin id, snapshot hash, permission list, command
//!   ids, operator and time. A record edited by hand, a lost key or a record
//!   copied from another machine fails it, and the approval counts as nothing
//!   approved: the approved copy waits again as `store-changed`.
//! - When `plugins.json` is missing or unreadable while plugin folders exist,
//!   the records are made again from the folders, each waiting as
//!   `store-changed` and switched on; nothing counts as approved.
//! - The snapshot hash of a copy that fails the folder checks (a copy that
//!   changed on disk) is computed over the same listing without the checks
//!   ([`raw_entries`]), so the operator sees what changed; such a copy
//!   cannot be approved.

use crossbeam_channel::{Sender, TrySendError, bounded};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::manifest::{self, MANIFEST_FILE, Problem, ProblemCode, Snapshot, SnapshotEntry};
use crate::errors::io_cause;
use crate::ids::hex;
use crate::limits;

/// The operator's approval of one copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Approval {
    pub snapshot_hash: String,
    /// In the order of the permission table.
    pub permissions: Vec<String>,
    /// In the manifest's order.
    pub commands: Vec<String>,
    pub operator: String,
    pub at: String,
    /// HMAC-SHA256 of the members above (see the module comment).
    pub check: String,
}

/// The copy that waits for approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Waiting {
    /// install, files-changed or store-changed.
    pub kind: String,
    pub snapshot_hash: String,
    pub installed_by: Option<String>,
    pub installed_at: String,
}

/// One plugin's record in plugins.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub plugin: String,
    pub enabled: bool,
    pub approval: Option<Approval>,
    pub waiting: Option<Waiting>,
    /// `removing` or `remove-failed` while a removal is not finished.
    pub removal: Option<String>,
    /// Lanes the plugin's task requests started, newest first.
    pub lanes: Vec<String>,
    /// Allowed task requests whose dispatch has not ended, newest first.
    pub starting: Vec<String>,
}

impl Record {
    pub fn new(plugin: &str) -> Record {
        Record {
            plugin: plugin.into(),
            enabled: true,
            approval: None,
            waiting: None,
            removal: None,
            lanes: vec![],
            starting: vec![],
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    plugins: Vec<Record>,
}

/// Which copy of a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    Approved,
    Waiting,
}

impl Copy {
    fn dir(self) -> &'static str {
        match self {
            Copy::Approved => "approved",
            Copy::Waiting => "waiting",
        }
    }
}

/// The store on disk.
pub struct Store {
    pub root: PathBuf,
    key: Option<Vec<u8>>,
}

fn mkdir_private(p: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(p)
}

fn sync_dir(p: &Path) {
    if let Ok(d) = fs::File::open(p) {
        let _ = d.sync_all();
    }
}

impl Store {
    /// Opens the store under `state_dir`, creating it and its key.
    pub fn open(state_dir: &Path) -> Result<Store, String> {
        let root = state_dir.join("plugins");
        mkdir_private(&root).map_err(|e| {
            format!(
                "unable to create the plugin store {}: {}",
                root.display(),
                io_cause(&e)
            )
        })?;
        let key_path = root.join("store.key");
        let key = match fs::read(&key_path) {
            Ok(k) if k.len() == 32 => Some(k),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut k = [0u8; 32];
                getrandom::fill(&mut k)
                    .map_err(|e| format!("unable to make the store key: {e}"))?;
                let written = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&key_path)
                    .and_then(|mut f| f.write_all(&k).and_then(|_| f.sync_all()));
                match written {
                    Ok(()) => {
                        sync_dir(&root);
                        Some(k.to_vec())
                    }
                    Err(e) => {
                        return Err(format!(
                            "unable to write {}: {}",
                            key_path.display(),
                            io_cause(&e)
                        ));
                    }
                }
            }
            Err(_) => None,
        };
        if key.is_none() {
            crate::warn!(
                "the plugin store key {} cannot be used; no approval will count",
                key_path.display()
            );
        }
        Ok(Store { root, key })
    }

    pub fn plugin_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    pub fn copy_dir(&self, id: &str, which: Copy) -> PathBuf {
        self.root.join(id).join(which.dir())
    }

    /// The plugin's own working directory, created on demand.
    pub fn work_dir(&self, id: &str) -> std::io::Result<PathBuf> {
        let p = self.root.join(id).join("work");
        mkdir_private(&p)?;
        Ok(p)
    }

    /// The integrity check of an approval.
    pub fn check_of(&self, plugin: &str, a: &Approval) -> Option<String> {
        let key = self.key.as_ref()?;
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        let text = format!(
            "omniconflux-approval-v1\0{plugin}\0{}\0{}\0{}\0{}\0{}",
            a.snapshot_hash,
            a.permissions.join(","),
            a.commands.join(","),
            a.operator,
            a.at
        );
        Some(hex(ring::hmac::sign(&k, text.as_bytes()).as_ref()))
    }

    /// Whether an approval passes its check.
    pub fn verify(&self, plugin: &str, a: &Approval) -> bool {
        self.check_of(plugin, a).is_some_and(|c| c == a.check)
    }

    /// Reads plugins.json; see the module comment for a missing or broken one.
    pub fn load(&self) -> Vec<Record> {
        let path = self.root.join("plugins.json");
        match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<File>(&bytes) {
                Ok(f) if f.version == 1 => return f.plugins,
                _ => crate::error!(
                    "{} is not a plugin record this daemon wrote; making the records again from the store's folders",
                    path.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => crate::error!(
                "unable to read {}: {}; making the records again from the store's folders",
                path.display(),
                io_cause(&e)
            ),
        }
        let mut out = Vec::new();
        let Ok(dir) = fs::read_dir(&self.root) else {
            return out;
        };
        let mut names: Vec<String> = dir
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            if !manifest::is_plugin_id(&name) {
                continue;
            }
            let approved = self.copy_dir(&name, Copy::Approved);
            let waiting = self.copy_dir(&name, Copy::Waiting);
            if waiting.is_dir() && !approved.is_dir() {
                let _ = fs::rename(&waiting, &approved);
            }
            if !approved.is_dir() {
                continue;
            }
            let _ = fs::remove_dir_all(&waiting);
            let _ = fs::rename(&approved, &waiting);
            let mut r = Record::new(&name);
            r.waiting = Some(Waiting {
                kind: "store-changed".into(),
                snapshot_hash: raw_hash(&waiting),
                installed_by: None,
                installed_at: crate::clock::now_ts(),
            });
            out.push(r);
        }
        if !out.is_empty() {
            if let Err(e) = self.save(out.clone()) {
                crate::error!("{e}");
            }
        }
        out
    }

    /// Writes plugins.json; blocking, so only at start, before the reactor
    /// serves anyone (later writes go through the `plugin-records` thread).
    pub fn save(&self, records: Vec<Record>) -> Result<(), String> {
        write_records(&self.root, records)
    }

    /// Moves a staged copy in as the plugin's waiting copy. A copy that
    /// waited before is moved aside, not deleted: the returned folder is
    /// for the caller to delete off the reactor ([`Worker`]).
    pub fn place_waiting(&self, id: &str, staging: &Path) -> std::io::Result<Option<PathBuf>> {
        mkdir_private(&self.plugin_dir(id))?;
        let dst = self.copy_dir(id, Copy::Waiting);
        let retired = if dst.exists() {
            let retired = self.retired_dir();
            fs::rename(&dst, &retired)?;
            Some(retired)
        } else {
            None
        };
        // Made durable by the next write of the records, which the answer
        // waits for ([`write_records`]).
        fs::rename(staging, &dst)?;
        Ok(retired)
    }

    /// Puts the waiting copy in force: it replaces the approved copy,
    /// which is moved aside for the caller to delete off the reactor, as
    /// in [`Store::place_waiting`].
    pub fn promote_waiting(&self, id: &str) -> std::io::Result<Option<PathBuf>> {
        let approved = self.copy_dir(id, Copy::Approved);
        let waiting = self.copy_dir(id, Copy::Waiting);
        let retired = if approved.exists() {
            let retired = self.retired_dir();
            fs::rename(&approved, &retired)?;
            Some(retired)
        } else {
            None
        };
        // Made durable by the next write of the records ([`write_records`]).
        fs::rename(&waiting, &approved)?;
        Ok(retired)
    }

    /// A new name for a copy on its way out; the sweep at start deletes
    /// any a stop left behind.
    fn retired_dir(&self) -> PathBuf {
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        self.root.join(format!(".retired-{}", hex(&b)))
    }

    /// Moves the approved copy aside to wait (files-changed, store-changed).
    pub fn demote_approved(&self, id: &str) -> std::io::Result<()> {
        let waiting = self.copy_dir(id, Copy::Waiting);
        if waiting.exists() {
            fs::remove_dir_all(&waiting)?;
        }
        fs::rename(self.copy_dir(id, Copy::Approved), waiting)
    }

    pub fn remove_copy(&self, id: &str, which: Copy) -> std::io::Result<()> {
        match fs::remove_dir_all(self.copy_dir(id, which)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Takes a copy out of the store by moving it aside (a rename): the
    /// returned folder is for the caller to delete off the reactor, as in
    /// [`Store::place_waiting`]. `None` when there is no such copy.
    pub fn retire_copy(&self, id: &str, which: Copy) -> std::io::Result<Option<PathBuf>> {
        self.retire(&self.copy_dir(id, which))
    }

    /// Takes everything of the plugin out of the store, as
    /// [`Store::retire_copy`] does a copy.
    pub fn retire_plugin(&self, id: &str) -> std::io::Result<Option<PathBuf>> {
        self.retire(&self.plugin_dir(id))
    }

    fn retire(&self, dir: &Path) -> std::io::Result<Option<PathBuf>> {
        let retired = self.retired_dir();
        match fs::rename(dir, &retired) {
            Ok(()) => Ok(Some(retired)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes staging folders a crash left behind.
    pub fn sweep(&self) {
        if let Ok(dir) = fs::read_dir(&self.root) {
            for e in dir.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(".staging-") || name.starts_with(".retired-") {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// Writes plugins.json under the store's `root` atomically (module
/// comment), the records sorted by plugin id. Each plugin's folder is
/// synced first, so that the copies a record names, moved in by renames
/// on the reactor, are on disk before the record is.
pub fn write_records(root: &Path, mut records: Vec<Record>) -> Result<(), String> {
    let path = root.join("plugins.json");
    let tmp = root.join(".plugins.json.tmp");
    records.sort_by(|a, b| a.plugin.cmp(&b.plugin));
    for r in &records {
        sync_dir(&root.join(&r.plugin));
    }
    let text = serde_json::to_vec_pretty(&File {
        version: 1,
        plugins: records,
    })
    .map_err(|e| e.to_string())?;
    let res = (|| -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        sync_dir(root);
        Ok(())
    })();
    res.map_err(|e| format!("unable to write {}: {}", path.display(), io_cause(&e)))
}

/// Checks the folder at `src`, copies it into a staging folder of the
/// store under `root` and checks the copy. Returns the staging folder and
/// the copy's snapshot; the copy's hash must equal the source's. Blocking:
/// it runs on the `plugin-install` thread.
pub fn stage(root: &Path, src: &Path) -> Result<(PathBuf, Snapshot), Problem> {
    let first = manifest::check_folder(src)?;
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let staging = root.join(format!(".staging-{}", hex(&b)));
    let src_real = fs::canonicalize(src)
        .map_err(|_| Problem::new(ProblemCode::FolderUnreadable, "the folder cannot be opened"))?;
    if let Err(e) = mkdir_private(&staging).and_then(|_| copy_tree(&src_real, &staging)) {
        let _ = fs::remove_dir_all(&staging);
        if e.get_ref().is_some_and(|i| i.is::<GrewPastCheck>()) {
            return Err(Problem::new(
                ProblemCode::FileTooLarge,
                GrewPastCheck.to_string(),
            ));
        }
        return Err(Problem::new(
            ProblemCode::FolderUnreadable,
            format!("the folder cannot be copied: {}", io_cause(&e)),
        ));
    }
    match manifest::check_folder(&staging) {
        Ok(copy) if copy.hash == first.hash => Ok((staging, copy)),
        Ok(_) => {
            let _ = fs::remove_dir_all(&staging);
            Err(Problem::new(
                ProblemCode::FolderUnreadable,
                "the folder changed while it was copied",
            ))
        }
        Err(p) => {
            let _ = fs::remove_dir_all(&staging);
            Err(p)
        }
    }
}

/// Work for a [`Worker`]'s thread.
pub type Job = Box<dyn FnOnce() + Send>;

/// One thread that does the store's blocking file work, in the order it
/// is queued, from a bounded queue. The reactor queues with
/// [`Worker::queue`], which never waits: a full queue is the caller's to
/// answer.
pub struct Worker {
    name: &'static str,
    tx: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread `name` with room for `queue` jobs.
    pub fn spawn(name: &'static str, queue: usize) -> std::io::Result<Worker> {
        let (tx, rx) = bounded::<Job>(queue);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })?;
        Ok(Worker {
            name,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `job`; the error says why it could not be.
    pub fn queue(&self, job: Job) -> Result<(), String> {
        let Some(tx) = &self.tx else {
            return Err(format!("the {} thread is stopped", self.name));
        };
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(format!("the {} thread is busy", self.name)),
            Err(TrySendError::Disconnected(_)) => {
                Err(format!("the {} thread is stopped", self.name))
            }
        }
    }

    /// Whether the thread ended (a job panicked): it takes nothing more.
    pub fn stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Lets the thread finish what is queued, and waits for it.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A file grew past the size bound after the folder was checked.
#[derive(Debug)]
struct GrewPastCheck;

impl std::fmt::Display for GrewPastCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a file grew past 32 MiB while it was copied")
    }
}

impl std::error::Error for GrewPastCheck {}

/// Copies a checked plugin folder: folders, regular files (keeping the
/// execute bits) and symbolic links as links. The source passed
/// [`manifest::check_folder`], so there is nothing else in it.
pub fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if ty.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
        } else if ty.is_dir() {
            mkdir_private(&to)?;
            copy_tree(&entry.path(), &to)?;
        } else if ty.is_file() {
            let mode = entry.metadata()?.permissions().mode();
            let mut from = fs::File::open(entry.path())?;
            let mut out = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if mode & 0o111 != 0 { 0o700 } else { 0o600 })
                .open(&to)?;
            // The check bounded the file; one that grew since is refused
            // rather than copied without bound.
            let limit = limits::PLUGIN_FILE_MAX_BYTES;
            let mut from = (&mut from).take(limit + 1);
            let mut buf = vec![0u8; 64 * 1024];
            let mut copied: u64 = 0;
            loop {
                let n = from.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                copied += n as u64;
                if copied > limit {
                    return Err(std::io::Error::other(GrewPastCheck));
                }
                out.write_all(&buf[..n])?;
            }
            out.sync_all()?;
        }
    }
    Ok(())
}

/// The snapshot listing of a folder without the folder checks (module
/// comment), at most the check's entry bound.
pub fn raw_entries(root: &Path) -> Vec<SnapshotEntry> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<SnapshotEntry>, budget: &mut usize) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Ok(meta) = fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&p)
                    .map(|t| t.as_os_str().as_encoded_bytes().to_vec())
                    .unwrap_or_default();
                out.push(entry(rel, 0o120000, &target));
            } else if meta.is_dir() {
                walk(root, &p, out, budget);
            } else if meta.is_file() && meta.len() <= limits::PLUGIN_FILE_MAX_BYTES {
                let bytes = fs::read(&p).unwrap_or_default();
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    0o100755
                } else {
                    0o100644
                };
                out.push(entry(rel, mode, &bytes));
            }
        }
    }
    fn entry(path: String, mode: u32, content: &[u8]) -> SnapshotEntry {
        let mut sha = [0u8; 32];
        sha.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, content).as_ref());
        SnapshotEntry {
            path,
            mode,
            size: content.len() as u64,
            sha256: sha,
        }
    }
    let mut out = Vec::new();
    let mut budget = limits::PLUGIN_FOLDER_MAX_ENTRIES;
    walk(root, root, &mut out, &mut budget);
    out.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    out
}

/// The snapshot hash of a folder as it is on disk (module comment).
pub fn raw_hash(root: &Path) -> String {
    manifest::snapshot_hash(&raw_entries(root))
}

/// The manifest file of a copy as JSON, when it is a JSON object.
pub fn manifest_json(dir: &Path) -> Option<Value> {
    let bytes = fs::read(dir.join(MANIFEST_FILE)).ok()?;
    if bytes.len() as u64 > limits::PLUGIN_MANIFEST_MAX_BYTES {
        return None;
    }
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.is_object().then_some(v)
}

/// plugin.get's `waiting.diff`: one entry per manifest member that differs,
/// then the files entry (seed 000, plugin.get).
pub fn diff(
    before: Option<(&Value, &[SnapshotEntry])>,
    after: (Option<&Value>, &[SnapshotEntry]),
) -> Vec<Value> {
    let mut out = Vec::new();
    let member =
        |m: Option<&Value>, k: &str| m.and_then(|v| v.get(k)).cloned().unwrap_or(Value::Null);
    // The manifest members in the order of plugin.get's diff field list.
    for k in manifest::MEMBERS {
        let b = member(before.map(|b| b.0), k);
        let a = member(after.0, k);
        if a != b {
            out.push(json!({"field": k, "before": b, "after": a}));
        }
    }
    let old: &[SnapshotEntry] = before.map(|b| b.1).unwrap_or(&[]);
    let new = after.1;
    let (mut added, mut removed, mut changed) = (0u64, 0u64, 0u64);
    let mut paths = Vec::new();
    for e in new {
        match old.iter().find(|o| o.path == e.path) {
            None => {
                added += 1;
                paths.push(e.path.clone());
            }
            Some(o) if o != e => {
                changed += 1;
                paths.push(e.path.clone());
            }
            Some(_) => {}
        }
    }
    for o in old {
        if !new.iter().any(|e| e.path == o.path) {
            removed += 1;
            paths.push(o.path.clone());
        }
    }
    paths.sort();
    paths.truncate(limits::PLUGIN_DIFF_PATHS_MAX);
    let paths: Vec<String> = paths
        .into_iter()
        .map(|p| crate::plugins::text::cut_chars(&p, 200).to_string())
        .collect();
    out.push(json!({"field": "files", "added": added, "removed": removed, "changed": changed, "paths": paths}));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_worker_runs_jobs_in_order_refuses_past_its_queue_and_finishes_them() {
        let mut w = Worker::spawn("store-test", 2).unwrap();
        let (hold_tx, hold_rx) = crossbeam_channel::bounded::<()>(0);
        let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(0);
        let seen = Arc::new(Mutex::new(Vec::new()));
        // The first job holds the thread until the test lets it go.
        w.queue(Box::new(move || {
            started_tx.send(()).unwrap();
            hold_rx.recv().unwrap();
        }))
        .unwrap();
        started_rx.recv().unwrap();
        for n in 0..2 {
            let seen = seen.clone();
            w.queue(Box::new(move || seen.lock().unwrap().push(n)))
                .unwrap();
        }
        assert_eq!(
            w.queue(Box::new(|| {})),
            Err("the store-test thread is busy".to_string())
        );
        assert!(!w.stopped());
        hold_tx.send(()).unwrap();
        w.finish();
        assert!(w.stopped());
        assert_eq!(*seen.lock().unwrap(), vec![0, 1]);
        assert_eq!(
            w.queue(Box::new(|| {})),
            Err("the store-test thread is stopped".to_string())
        );
    }

    #[test]
    fn records_are_written_sorted_and_read_back() {
        let dir = crate::testutil::TempDir::new("store-records");
        let store = Store::open(dir.path()).unwrap();
        write_records(&store.root, vec![Record::new("zeta"), Record::new("alpha")]).unwrap();
        let back: Vec<String> = store.load().into_iter().map(|r| r.plugin).collect();
        assert_eq!(back, vec!["alpha", "zeta"]);
    }
}
