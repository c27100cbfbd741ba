//! ACP fs/read_text_file and fs/write_text_file, served on the reactor.
//!
//! Files are opened relative to a descriptor of the session's worktree with
//! openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) and O_NOFOLLOW, so no
//! symlink (dangling or not, in any component) and no `..` can lead out,
//! and nothing can be swapped between a check and the open. Where the
//! kernel has no openat2 (ENOSYS), the canonical-path check of
//! `risk::confined` is used with O_NOFOLLOW on the last component.
//!
//! Reads open with O_NONBLOCK and require a regular file (fstat on the open
//! descriptor), so a FIFO or a device cannot hold the reactor; they read at
//! most `AGENT_FS_MAX_BYTES + 1` bytes and refuse anything larger.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::limits;

fn outside(path: &str) -> String {
    format!("{path} is outside the session's worktree")
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| "the path contains a NUL byte".to_string())
}

/// Opens `path` (absolute, inside `worktree`) with `flags`; O_NOFOLLOW and
/// O_CLOEXEC are always added.
fn open_beneath(worktree: &Path, path: &str, flags: libc::c_int) -> Result<File, String> {
    let clean = crate::agents::acp::confine(worktree, path).map_err(|_| outside(path))?;
    let rel = clean.strip_prefix(worktree).map_err(|_| outside(path))?;
    if rel.as_os_str().is_empty() {
        return Err(format!("{path} is the worktree itself, not a file"));
    }
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mode: libc::mode_t = 0o644;
    let c_wt = cstr(worktree)?;
    let c_rel = cstr(rel)?;
    // SAFETY: open on a NUL-terminated path we own; the result is checked.
    let dfd = unsafe {
        libc::open(
            c_wt.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(crate::errors::io_cause(&std::io::Error::last_os_error()));
    }
    // SAFETY: a non-negative return is a fresh descriptor owned by nobody else.
    let dir = unsafe { OwnedFd::from_raw_fd(dfd) };
    // SAFETY: open_how is plain integers; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        mode as u64
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `how` (of the size passed) and the NUL-terminated
    // path, both alive for the call; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c_rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = if fd >= 0 {
        fd as libc::c_int
    } else {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS) => {
                if !crate::core::risk::confined(worktree, path) {
                    return Err(outside(path));
                }
                let c_abs = cstr(&clean)?;
                // SAFETY: as above; the mode argument is read only with O_CREAT.
                let fd = unsafe { libc::open(c_abs.as_ptr(), flags, mode as libc::c_uint) };
                if fd < 0 {
                    return Err(refusal(path, &std::io::Error::last_os_error()));
                }
                fd
            }
            _ => return Err(refusal(path, &e)),
        }
    };
    // SAFETY: a non-negative return is a fresh descriptor owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn refusal(path: &str, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EXDEV) => outside(path),
        Some(libc::ELOOP) => format!("{path} is a symbolic link; the agent may not follow it"),
        Some(libc::ENXIO) => format!("{path} is not a regular file"),
        _ => crate::errors::io_cause(e),
    }
}

fn regular(f: &File, path: &str) -> Result<(), String> {
    let meta = f.metadata().map_err(|e| crate::errors::io_cause(&e))?;
    if !meta.file_type().is_file() {
        return Err(format!("{path} is not a regular file"));
    }
    Ok(())
}

pub fn read_text(worktree: &Path, path: &str) -> Result<String, String> {
    let f = open_beneath(worktree, path, libc::O_RDONLY | libc::O_NONBLOCK)?;
    regular(&f, path)?;
    let mut buf = Vec::new();
    f.take(limits::AGENT_FS_MAX_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| crate::errors::io_cause(&e))?;
    if buf.len() as u64 > limits::AGENT_FS_MAX_BYTES {
        return Err(format!(
            "the file is over {} bytes",
            limits::AGENT_FS_MAX_BYTES
        ));
    }
    String::from_utf8(buf).map_err(|_| format!("{path} is not UTF-8 text"))
}

pub fn write_text(worktree: &Path, path: &str, content: &str) -> Result<(), String> {
    if content.len() as u64 > limits::AGENT_FS_MAX_BYTES {
        return Err(format!(
            "the content is over {} bytes",
            limits::AGENT_FS_MAX_BYTES
        ));
    }
    // O_NONBLOCK so a FIFO without a reader fails (ENXIO) instead of
    // blocking; truncation waits until the target is known to be regular.
    let mut f = open_beneath(
        worktree,
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_NONBLOCK,
    )?;
    regular(&f, path)?;
    f.set_len(0).map_err(|e| crate::errors::io_cause(&e))?;
    f.write_all(content.as_bytes())
        .map_err(|e| crate::errors::io_cause(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tmp(tag: &str) -> PathBuf {
        let base = std::env::temp_dir()
            .canonicalize()
            .unwrap()
            .join(format!("agentfs-{tag}-{}", crate::ids::prefixed_id("")));
        std::fs::create_dir_all(&base).unwrap();
        base
    }

    #[test]
    fn reads_and_writes_inside() {
        let wt = tmp("in");
        std::fs::create_dir(wt.join("sub")).unwrap();
        let p = wt.join("sub/a.txt").display().to_string();
        write_text(&wt, &p, "hello").unwrap();
        write_text(&wt, &p, "hi").unwrap();
        assert_eq!(read_text(&wt, &p).unwrap(), "hi");
        assert!(read_text(&wt, &wt.display().to_string()).is_err());
        assert!(write_text(&wt, "/etc/passwd", "x").is_err());
        assert!(read_text(&wt, &format!("{}/../x", wt.display())).is_err());
        let _ = std::fs::remove_dir_all(&wt);
    }

    #[test]
    fn a_dangling_symlink_out_is_refused_and_nothing_is_created() {
        let wt = tmp("wt");
        let out = tmp("out");
        let target = out.join("created.txt");
        std::os::unix::fs::symlink(&target, wt.join("link")).unwrap();
        let p = wt.join("link").display().to_string();
        assert!(write_text(&wt, &p, "pwned").is_err());
        assert!(!target.exists());
        assert!(read_text(&wt, &p).is_err());
        assert!(!crate::core::risk::confined(&wt, &p));
        // A symlinked directory pointing out.
        std::os::unix::fs::symlink(&out, wt.join("dir")).unwrap();
        let q = wt.join("dir/new.txt").display().to_string();
        assert!(write_text(&wt, &q, "pwned").is_err());
        assert!(!out.join("new.txt").exists());
        std::fs::write(out.join("secret"), "s").unwrap();
        assert!(read_text(&wt, &wt.join("dir/secret").display().to_string()).is_err());
        // A symlink to a file inside is refused too (O_NOFOLLOW).
        std::fs::write(wt.join("real"), "r").unwrap();
        std::os::unix::fs::symlink(wt.join("real"), wt.join("alias")).unwrap();
        assert!(write_text(&wt, &wt.join("alias").display().to_string(), "x").is_err());
        assert_eq!(std::fs::read_to_string(wt.join("real")).unwrap(), "r");
        let _ = std::fs::remove_dir_all(&wt);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let wt = tmp("fifo");
        let fifo = wt.join("pipe");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let p = fifo.display().to_string();
        let e = read_text(&wt, &p).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(write_text(&wt, &p, "x").is_err());
        let _ = std::fs::remove_dir_all(&wt);
    }

    #[test]
    fn larger_files_are_refused() {
        let wt = tmp("big");
        let f = wt.join("big");
        std::fs::write(&f, vec![b'a'; limits::AGENT_FS_MAX_BYTES as usize + 1]).unwrap();
        assert!(
            read_text(&wt, &f.display().to_string())
                .unwrap_err()
                .contains("over")
        );
        let _ = std::fs::remove_dir_all(&wt);
    }
}
