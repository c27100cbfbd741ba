//! Git operations of the lane loop (issue 5): worktrees and branches for a
//! builder, the lane's commit, the diff a verifier reads, a detached
//! checkout for the acceptance command, and the merge into base. Each call
//! runs `git` and waits for it, so they run on the lane worker threads,
//! never on the reactor.
//!
//! Every command runs with an environment that names no repository of its
//! own (`GIT_DIR` and friends removed), no pager, no prompts, no editor
//! and no user configuration beyond the repository's, so that the daemon's
//! git behaves the same whoever started it. Commits the daemon makes carry
//! the identity `omniconfluxd <omniconfluxd@localhost>` and say why they
//! were made.
//!
//! The repository's git directory is the builder's to write (issue 16):
//! its `hooks/` and `config` are an agent's work, but the daemon's git runs
//! as the operator. So the daemon's git runs no hooks (`core.hooksPath`
//! is `/dev/null`), no file-system monitor, signs nothing (a
//! `gpg.program` is a command too), never starts an editor
//! (`GIT_EDITOR=true`; every commit says its message with `-m`) and does no
//! automatic housekeeping (`gc.auto=0`, `maintenance.auto=false`: the
//! operator's own git does it), whatever the repository configures; the
//! diff a verifier reads runs no textconv. What configuration can still
//! make git run (a filter driver named in `.gitattributes`, a merge
//! driver) runs, when agents are contained, in the same kind of namespace
//! as agents (`crate::isolation::namespace`): the daemon's socket, state
//! directory and the operator's services are out of its reach there, the
//! repository and its worktrees are where they are on the host, and the
//! daemon's checkouts under `STATE/lanes` are bound back, writable. While
//! agents run uncontained (or before the isolation probe has answered,
//! when no lane runs yet) the daemon's git runs on the host, hooks still
//! off.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::isolation::{Access, Hidden};

/// A failed git command: what was attempted and git's own first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitError(pub String);

impl std::fmt::Display for GitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type Result<T> = std::result::Result<T, GitError>;

const IDENTITY: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "omniconfluxd"),
    ("GIT_AUTHOR_EMAIL", "omniconfluxd@localhost"),
    ("GIT_COMMITTER_NAME", "omniconfluxd"),
    ("GIT_COMMITTER_EMAIL", "omniconfluxd@localhost"),
];

/// Where the daemon's git runs (module comment).
#[derive(Debug, Clone)]
pub struct Git {
    contained: Option<Arc<Contained>>,
}

#[derive(Debug)]
struct Contained {
    bwrap: PathBuf,
    hidden: Hidden,
    /// The daemon's checkouts, `STATE/lanes`, which the hidden state
    /// directory would cover.
    lanes_dir: PathBuf,
}

/// What keeps the repository's configuration from running anything
/// through the daemon's git (module comment).
const HARDENING: [&str; 6] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gc.auto=0",
    "maintenance.auto=false",
];

impl Git {
    /// Git on the host, as the daemon's user.
    pub const fn host() -> Git {
        Git { contained: None }
    }

    /// Git in the agents' kind of namespace through `bwrap`, with `hidden`
    /// covered and the daemon's checkouts under `lanes_dir` writable.
    pub fn contained(bwrap: PathBuf, hidden: Hidden, lanes_dir: &Path) -> Git {
        Git {
            contained: Some(Arc::new(Contained {
                bwrap,
                hidden,
                lanes_dir: crate::isolation::resolved(lanes_dir),
            })),
        }
    }

    pub fn is_contained(&self) -> bool {
        self.contained.is_some()
    }

    /// `git -C dir` with the hardening and the environment of the module
    /// comment, in the namespace when there is one.
    fn cmd(&self, dir: &Path) -> Command {
        let mut c = match &self.contained {
            None => Command::new("git"),
            Some(n) => {
                // Made before it is bound: a checkout's first `worktree
                // add` would make it, but a bind needs it there.
                let _ = std::fs::create_dir_all(&n.lanes_dir);
                let dir = crate::isolation::resolved(dir);
                let mut back = vec![(n.lanes_dir.as_path(), Access::Writable)];
                if dir.exists() && !dir.starts_with(&n.lanes_dir) {
                    back.push((dir.as_path(), Access::Writable));
                }
                let mut c = crate::isolation::namespace(&n.bwrap, &n.hidden, &back);
                c.args(["--chdir", "/", "--", "git"]);
                c
            }
        };
        for kv in HARDENING {
            c.arg("-c").arg(kv);
        }
        c.arg("-C").arg(dir);
        for k in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
            "GIT_COMMON_DIR",
            "GIT_NAMESPACE",
            "GIT_CONFIG_PARAMETERS",
            "GIT_CONFIG_COUNT",
        ] {
            c.env_remove(k);
        }
        c.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_PAGER", "cat")
            .env("GIT_EDITOR", "true")
            .env("GIT_SEQUENCE_EDITOR", "true")
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        c
    }
}

/// Runs git; stdout on success, the error's first line otherwise.
fn run(what: &str, mut cmd: Command) -> Result<String> {
    let out = cmd.output().map_err(|e| {
        GitError(format!(
            "{what}: unable to run git: {}",
            crate::errors::io_cause(&e)
        ))
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("git failed")
            .trim()
            .to_string();
        Err(GitError(format!("{what}: {first}")))
    }
}

fn succeeds(mut cmd: Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The top of the repository that holds `dir`, or an error when it is none.
pub fn toplevel(g: &Git, dir: &Path) -> Result<PathBuf> {
    let mut c = g.cmd(dir);
    c.args(["rev-parse", "--show-toplevel"]);
    Ok(PathBuf::from(
        run(&format!("{} is not a git repository", dir.display()), c)?.trim(),
    ))
}

/// The branch checked out in `worktree`, or None when HEAD is detached.
pub fn current_branch(g: &Git, worktree: &Path) -> Option<String> {
    let mut c = g.cmd(worktree);
    c.args(["symbolic-ref", "--quiet", "--short", "HEAD"]);
    run("symbolic-ref", c)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

pub fn branch_exists(g: &Git, repo: &Path, branch: &str) -> bool {
    let mut c = g.cmd(repo);
    c.args([
        "show-ref",
        "--verify",
        "--quiet",
        &format!("refs/heads/{branch}"),
    ]);
    succeeds(c)
}

/// The full commit id `rev` names, or None.
pub fn commit_of(g: &Git, repo: &Path, rev: &str) -> Option<String> {
    let mut c = g.cmd(repo);
    c.args([
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{rev}^{{commit}}"),
    ]);
    run("rev-parse", c)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| is_commit_id(s))
}

/// The commits the local branches `branches` of `repo` point at now, by
/// branch name; a branch that does not exist (or a repository that is
/// gone) is simply not in the map. One `git for-each-ref` for them all.
pub fn branch_heads(
    g: &Git,
    repo: &Path,
    branches: &[String],
) -> std::collections::HashMap<String, String> {
    let mut c = g.cmd(repo);
    c.args(["for-each-ref", "--format=%(objectname) %(refname)"]);
    c.args(branches.iter().map(|b| format!("refs/heads/{b}")));
    let Ok(text) = run("for-each-ref", c) else {
        return Default::default();
    };
    text.lines()
        .filter_map(|l| {
            let (commit, name) = l.split_once(' ')?;
            let b = name.strip_prefix("refs/heads/")?;
            (branches.iter().any(|x| x == b) && is_commit_id(commit))
                .then(|| (b.to_string(), commit.to_string()))
        })
        .collect()
}

pub fn is_commit_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is a branch name git accepts.
pub fn valid_branch_name(g: &Git, repo: &Path, name: &str) -> bool {
    let mut c = g.cmd(repo);
    c.args(["check-ref-format", "--branch", name]);
    succeeds(c)
}

/// Creates `branch` at `base` and checks it out in a new worktree at `path`.
pub fn add_worktree(g: &Git, repo: &Path, path: &Path, branch: &str, base: &str) -> Result<()> {
    let mut c = g.cmd(repo);
    c.args(["worktree", "add", "--quiet", "-b", branch])
        .arg(path)
        .arg(base);
    run(&format!("unable to add worktree {}", path.display()), c).map(drop)
}

/// A detached checkout of `commit` at `path`, for the acceptance command.
pub fn add_detached(g: &Git, repo: &Path, path: &Path, commit: &str) -> Result<()> {
    let mut c = g.cmd(repo);
    c.args(["worktree", "add", "--quiet", "--detach"])
        .arg(path)
        .arg(commit);
    run(
        &format!("unable to check out {commit} at {}", path.display()),
        c,
    )
    .map(drop)
}

/// Puts a daemon-owned checkout at `commit`, exactly: made with a full
/// checkout when it does not exist, otherwise moved with `checkout --detach
/// --force` and `clean -ffdx`, which touch only what differs. Whatever a
/// check or a verifier wrote there (of this lane or of the lane that held
/// the checkout before) is gone afterwards, ignored files included. A
/// checkout git can no longer move (its folder damaged, its record pruned)
/// is removed and made anew rather than handed on broken.
pub fn checkout_exactly(g: &Git, repo: &Path, path: &Path, commit: &str) -> Result<()> {
    if path.join(".git").exists() && move_exactly(g, path, commit).is_ok() {
        return Ok(());
    }
    if path.exists() {
        let _ = remove_worktree(g, repo, path);
        if path.exists() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
    // The repository's record of a checkout whose folder is gone (or was
    // just removed by hand above) would refuse the new one.
    let mut p = g.cmd(repo);
    p.args(["worktree", "prune"]);
    let _ = run("worktree prune", p);
    add_detached(g, repo, path, commit)
}

fn move_exactly(g: &Git, path: &Path, commit: &str) -> Result<()> {
    let mut c = g.cmd(path);
    c.args(["checkout", "--quiet", "--detach", "--force", commit]);
    run(
        &format!("unable to check out {commit} at {}", path.display()),
        c,
    )?;
    let mut c = g.cmd(path);
    c.args(["clean", "-ffdxq"]);
    run(&format!("unable to clean {}", path.display()), c).map(drop)
}

/// The common git directory of the checkout that holds `dir`, absolute:
/// `<repo>/.git` for a worktree of a repository, where its objects and
/// refs are and, under `worktrees/`, the worktree's own HEAD and index.
pub fn common_dir(g: &Git, dir: &Path) -> Result<PathBuf> {
    let mut c = g.cmd(dir);
    c.args(["rev-parse", "--path-format=absolute", "--git-common-dir"]);
    Ok(PathBuf::from(
        run(&format!("{} is not a git checkout", dir.display()), c)?.trim(),
    ))
}

/// The repository a worktree belongs to: the folder holding its common git
/// directory (`<repo>/.git`), or that directory itself for a bare one.
pub fn repository_of(g: &Git, worktree: &Path) -> Result<PathBuf> {
    let common = common_dir(g, worktree)?;
    Ok(if common.file_name().is_some_and(|n| n == ".git") {
        common.parent().map(Path::to_path_buf).unwrap_or(common)
    } else {
        common
    })
}

pub fn remove_worktree(g: &Git, repo: &Path, path: &Path) -> Result<()> {
    let mut c = g.cmd(repo);
    c.args(["worktree", "remove", "--force"]).arg(path);
    let r = run(&format!("unable to remove worktree {}", path.display()), c).map(drop);
    // A worktree whose folder is already gone only needs its record pruned.
    let mut p = g.cmd(repo);
    p.args(["worktree", "prune"]);
    let _ = run("worktree prune", p);
    if r.is_err() && !path.exists() {
        Ok(())
    } else {
        r
    }
}

pub fn delete_branch(g: &Git, repo: &Path, branch: &str) -> Result<()> {
    let mut c = g.cmd(repo);
    c.args(["branch", "-D", "--quiet", branch]);
    run(&format!("unable to delete branch {branch}"), c).map(drop)
}

/// Whether the worktree has no changes, staged or not, untracked included.
pub fn is_clean(g: &Git, worktree: &Path) -> Result<bool> {
    let mut c = g.cmd(worktree);
    c.args(["status", "--porcelain", "--untracked-files=normal"]);
    Ok(run("status", c)?.trim().is_empty())
}

/// Commits everything left uncommitted in `worktree`; returns the new HEAD,
/// and whether a commit was made.
pub fn commit_all(g: &Git, worktree: &Path, message: &str) -> Result<(String, bool)> {
    let mut add = g.cmd(worktree);
    add.args(["add", "--all"]);
    run("unable to stage the lane's work", add)?;
    let mut staged = g.cmd(worktree);
    staged.args(["diff", "--cached", "--quiet"]);
    let made = !succeeds(staged);
    if made {
        let mut c = g.cmd(worktree);
        c.envs(IDENTITY)
            .args(["commit", "--quiet", "--no-verify", "-m", message]);
        run("unable to commit the lane's work", c)?;
    }
    let head = commit_of(g, worktree, "HEAD")
        .ok_or_else(|| GitError("the lane's worktree has no HEAD".into()))?;
    Ok((head, made))
}

/// The diff from `base` to `head`, cut to `max` bytes at a line end.
pub fn diff(g: &Git, repo: &Path, base: &str, head: &str, max: usize) -> Result<String> {
    let mut c = g.cmd(repo);
    c.args([
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        &format!("{base}...{head}"),
    ]);
    let mut d = run("unable to diff the lane", c)?;
    if d.len() > max {
        let mut cut = max;
        while !d.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = d[..cut].rfind('\n').map_or(cut, |i| i + 1);
        d.truncate(cut);
        d.push_str("\n[diff cut here: it is longer than the verifier is shown]\n");
    }
    Ok(d)
}

/// How a pass is merged into base: the config's `[lanes] merge`.
pub use crate::config::MergeMode;

/// Why a merge did not happen, for merge-failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeFailure {
    DirtyMainWorktree,
    NotFastForward,
    Conflict(String),
    Git(GitError),
}

impl std::fmt::Display for MergeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeFailure::DirtyMainWorktree => {
                f.write_str("the main worktree has uncommitted changes")
            }
            MergeFailure::NotFastForward => {
                f.write_str("base moved on and the merge mode is fast-forward only")
            }
            MergeFailure::Conflict(files) => write!(f, "the merge conflicts in {files}"),
            MergeFailure::Git(e) => write!(f, "{e}"),
        }
    }
}

fn is_ancestor(g: &Git, repo: &Path, a: &str, b: &str) -> bool {
    let mut c = g.cmd(repo);
    c.args(["merge-base", "--is-ancestor", a, b]);
    succeeds(c)
}

/// Merges `commit` into `base`. When base is checked out in the repository's
/// main worktree, the merge happens there and needs it clean; otherwise the
/// branch ref is moved without touching any worktree (a merge commit is made
/// with `merge-tree --write-tree`). Returns base's new commit.
pub fn merge(
    g: &Git,
    repo: &Path,
    base: &str,
    commit: &str,
    mode: MergeMode,
    message: &str,
) -> std::result::Result<String, MergeFailure> {
    let old = commit_of(g, repo, &format!("refs/heads/{base}"))
        .ok_or_else(|| MergeFailure::Git(GitError(format!("base {base} is gone"))))?;
    if is_ancestor(g, repo, commit, &old) {
        return Ok(old); // already merged
    }
    let ff = is_ancestor(g, repo, &old, commit);
    if mode == MergeMode::FastForward && !ff {
        return Err(MergeFailure::NotFastForward);
    }
    if current_branch(g, repo).as_deref() == Some(base) {
        if !is_clean(g, repo).map_err(MergeFailure::Git)? {
            return Err(MergeFailure::DirtyMainWorktree);
        }
        let mut c = g.cmd(repo);
        c.envs(IDENTITY).args(["merge", "--quiet", "--no-edit"]);
        match mode {
            MergeMode::FastForward => c.arg("--ff-only"),
            MergeMode::MergeCommit => c.args(["--no-ff", "-m", message]),
        };
        c.arg(commit);
        if let Err(e) = run("unable to merge", c) {
            let conflicted = conflicted_files(g, repo);
            let mut abort = g.cmd(repo);
            abort.args(["merge", "--abort"]);
            let _ = run("merge --abort", abort);
            return Err(if conflicted.is_empty() {
                MergeFailure::Git(e)
            } else {
                MergeFailure::Conflict(conflicted)
            });
        }
        return commit_of(g, repo, "HEAD")
            .ok_or_else(|| MergeFailure::Git(GitError("no HEAD after the merge".into())));
    }
    let new = if mode == MergeMode::FastForward {
        commit.to_string()
    } else {
        let mut t = g.cmd(repo);
        t.args(["merge-tree", "--write-tree", "--name-only", &old, commit]);
        let out = t
            .output()
            .map_err(|e| MergeFailure::Git(GitError(format!("unable to run git: {e}"))))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let tree = lines.next().unwrap_or("").trim().to_string();
        if !out.status.success() {
            let files: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
            return Err(MergeFailure::Conflict(if files.is_empty() {
                "the tree".into()
            } else {
                files.join(", ")
            }));
        }
        let mut c = g.cmd(repo);
        c.envs(IDENTITY).args([
            "commit-tree",
            &tree,
            "-p",
            &old,
            "-p",
            commit,
            "-m",
            message,
        ]);
        run("unable to write the merge commit", c)
            .map_err(MergeFailure::Git)?
            .trim()
            .to_string()
    };
    let mut u = g.cmd(repo);
    u.args(["update-ref", &format!("refs/heads/{base}"), &new, &old]);
    run("unable to move base", u).map_err(MergeFailure::Git)?;
    Ok(new)
}

fn conflicted_files(g: &Git, repo: &Path) -> String {
    let mut c = g.cmd(repo);
    c.args(["diff", "--name-only", "--diff-filter=U"]);
    run("diff", c)
        .map(|s| s.lines().collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

/// The worktrees of a repository, for repos.list.
pub fn worktrees(g: &Git, repo: &Path) -> Result<Vec<(PathBuf, Option<String>)>> {
    let mut c = g.cmd(repo);
    c.args(["worktree", "list", "--porcelain"]);
    let text = run("worktree list", c)?;
    let mut out = Vec::new();
    let mut path: Option<PathBuf> = None;
    let mut branch = None;
    for line in text.lines().chain(std::iter::once("")) {
        if let Some(p) = line.strip_prefix("worktree ") {
            path = Some(PathBuf::from(p));
        } else if let Some(b) = line.strip_prefix("branch ") {
            branch = Some(b.trim_start_matches("refs/heads/").to_string());
        } else if line.is_empty() {
            if let Some(p) = path.take() {
                out.push((p, branch.take()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A repository with one commit on `main`.
    pub fn repo(dir: &Path) -> PathBuf {
        let g = Git::host();
        let r = dir.join("repo");
        std::fs::create_dir_all(&r).unwrap();
        let sh = |args: &[&str]| {
            let mut c = g.cmd(&r);
            c.envs(IDENTITY).args(args);
            run("setup", c).unwrap();
        };
        sh(&["init", "--quiet", "-b", "main"]);
        std::fs::write(r.join("a.txt"), "one\n").unwrap();
        sh(&["add", "a.txt"]);
        sh(&["commit", "--quiet", "-m", "first"]);
        r
    }

    #[test]
    fn worktree_commit_diff_merge_round_trip() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("git");
        let r = repo(tmp.path());
        assert_eq!(toplevel(&g, &r).unwrap(), r.canonicalize().unwrap());
        assert_eq!(current_branch(&g, &r).as_deref(), Some("main"));
        let wt = tmp.path().join("repo-wt/fix");
        add_worktree(&g, &r, &wt, "omni/fix", "main").unwrap();
        assert!(branch_exists(&g, &r, "omni/fix"));
        std::fs::write(wt.join("a.txt"), "two\n").unwrap();
        let (head, made) = commit_all(&g, &wt, "lane: work the builder left uncommitted").unwrap();
        assert!(made && is_commit_id(&head));
        let (same, made) = commit_all(&g, &wt, "nothing").unwrap();
        assert!(!made && same == head);
        let d = diff(&g, &r, "main", &head, 1 << 20).unwrap();
        assert!(d.contains("-one") && d.contains("+two"), "{d}");
        let new = merge(&g, &r, "main", &head, MergeMode::FastForward, "merge").unwrap();
        assert_eq!(new, head);
        assert_eq!(std::fs::read_to_string(r.join("a.txt")).unwrap(), "two\n");
        remove_worktree(&g, &r, &wt).unwrap();
        assert!(!wt.exists());
        delete_branch(&g, &r, "omni/fix").unwrap();
    }

    #[test]
    fn the_repositorys_hooks_and_monitor_never_run() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("githook");
        let r = repo(tmp.path());
        let marks = tmp.path().join("marks");
        std::fs::create_dir_all(&marks).unwrap();
        let hooks = r.join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        for h in ["post-checkout", "post-commit", "post-merge", "fsmonitor"] {
            let p = hooks.join(h);
            std::fs::write(&p, format!("#!/bin/sh\ntouch '{}/{h}'\n", marks.display())).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut c = g.cmd(&r);
        c.args(["config", "core.fsmonitor"])
            .arg(hooks.join("fsmonitor"));
        run("config", c).unwrap();
        let wt = tmp.path().join("wt");
        add_worktree(&g, &r, &wt, "omni/h", "main").unwrap();
        std::fs::write(wt.join("a.txt"), "two\n").unwrap();
        let (head, _) = commit_all(&g, &wt, "lane").unwrap();
        assert!(is_clean(&g, &r).unwrap());
        merge(&g, &r, "main", &head, MergeMode::FastForward, "m").unwrap();
        let ran: Vec<_> = std::fs::read_dir(&marks).unwrap().collect();
        assert!(ran.is_empty(), "{ran:?}");
    }

    #[test]
    fn branch_heads_names_only_the_branches_asked_for_that_exist() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("gith");
        let r = repo(tmp.path());
        let wt = tmp.path().join("wt");
        add_worktree(&g, &r, &wt, "omni/a", "main").unwrap();
        std::fs::write(wt.join("a.txt"), "two\n").unwrap();
        let (head, _) = commit_all(&g, &wt, "lane").unwrap();
        // omni/gone does not exist.
        let asked: Vec<String> = ["omni/a", "omni/gone"].map(String::from).to_vec();
        let heads = branch_heads(&g, &r, &asked);
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert_eq!(heads.get("omni/a"), Some(&head));
        // A repository that is gone has no branches.
        assert!(branch_heads(&g, &tmp.path().join("nothing"), &asked).is_empty());
    }

    #[test]
    fn conflicts_and_dirty_main_worktrees_fail_the_merge() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("gitc");
        let r = repo(tmp.path());
        let wt = tmp.path().join("wt");
        add_worktree(&g, &r, &wt, "omni/x", "main").unwrap();
        std::fs::write(wt.join("a.txt"), "lane\n").unwrap();
        let (head, _) = commit_all(&g, &wt, "lane").unwrap();
        std::fs::write(r.join("a.txt"), "main moved\n").unwrap();
        assert_eq!(
            merge(&g, &r, "main", &head, MergeMode::MergeCommit, "m"),
            Err(MergeFailure::DirtyMainWorktree)
        );
        commit_all(&g, &r, "main moved").unwrap();
        assert_eq!(
            merge(&g, &r, "main", &head, MergeMode::FastForward, "m"),
            Err(MergeFailure::NotFastForward)
        );
        match merge(&g, &r, "main", &head, MergeMode::MergeCommit, "m") {
            Err(MergeFailure::Conflict(files)) => assert!(files.contains("a.txt")),
            other => panic!("{other:?}"),
        }
        assert!(
            is_clean(&g, &r).unwrap(),
            "an aborted merge leaves the main worktree clean"
        );
    }

    #[test]
    fn a_merge_commit_without_checkout_moves_the_ref() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("gitm");
        let r = repo(tmp.path());
        let mut c = g.cmd(&r);
        c.args(["checkout", "--quiet", "-b", "other"]);
        run("checkout", c).unwrap();
        let wt = tmp.path().join("wt");
        add_worktree(&g, &r, &wt, "omni/y", "main").unwrap();
        std::fs::write(wt.join("b.txt"), "new\n").unwrap();
        let (head, _) = commit_all(&g, &wt, "lane").unwrap();
        let new = merge(&g, &r, "main", &head, MergeMode::MergeCommit, "merge lane").unwrap();
        assert_ne!(new, head);
        assert!(is_ancestor(&g, &r, &head, &new));
        assert_eq!(current_branch(&g, &r).as_deref(), Some("other"));
    }

    #[test]
    fn a_reused_checkout_is_moved_exactly_and_a_broken_one_is_made_anew() {
        let g = Git::host();
        let tmp = crate::testutil::TempDir::new("gitco");
        let r = repo(tmp.path());
        let first = commit_of(&g, &r, "HEAD").unwrap();
        let wt = tmp.path().join("wt");
        add_worktree(&g, &r, &wt, "omni/z", "main").unwrap();
        std::fs::write(wt.join("b.txt"), "lane\n").unwrap();
        let (second, _) = commit_all(&g, &wt, "lane").unwrap();
        let co = tmp.path().join("state/lanes/co-1");
        checkout_exactly(&g, &r, &co, &second).unwrap();
        assert_eq!(repository_of(&g, &co).unwrap(), r.canonicalize().unwrap());
        // What the last user wrote: a change, a new file, an ignored one.
        std::fs::write(co.join("a.txt"), "scribbled\n").unwrap();
        std::fs::write(co.join(".gitignore"), "out/\n").unwrap();
        std::fs::create_dir_all(co.join("out")).unwrap();
        std::fs::write(co.join("out/x"), "built\n").unwrap();
        checkout_exactly(&g, &r, &co, &first).unwrap();
        assert_eq!(commit_of(&g, &co, "HEAD").as_deref(), Some(first.as_str()));
        assert!(
            is_clean(&g, &co).unwrap() && !co.join("out").exists() && !co.join("b.txt").exists()
        );
        assert_eq!(std::fs::read_to_string(co.join("a.txt")).unwrap(), "one\n");
        // A checkout whose git link is broken is made anew.
        std::fs::write(co.join(".git"), "gitdir: /nowhere\n").unwrap();
        checkout_exactly(&g, &r, &co, &second).unwrap();
        assert_eq!(commit_of(&g, &co, "HEAD").as_deref(), Some(second.as_str()));
        assert!(is_clean(&g, &co).unwrap());
    }
}
