//! The tmux servers of one test: `default` and the daemon's own
//! `omniconflux`, on the test's own socket directory (`TMUX_TMPDIR`), never
//! the machine's, and killed when the test ends.

use std::path::PathBuf;
use std::process::Command;

pub struct Servers {
    pub tmpdir: PathBuf,
}

impl Servers {
    /// Runs `tmux -L server ARGS` and returns its standard output; a failure
    /// fails the test with tmux's standard error.
    pub fn tmux(&self, server: &str, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(server)
            .args(args)
            .env("TMUX_TMPDIR", &self.tmpdir)
            .env_remove("TMUX")
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for s in ["default", "omniconflux"] {
            let _ = Command::new("tmux")
                .args(["-L", s, "kill-server"])
                .env("TMUX_TMPDIR", &self.tmpdir)
                .env_remove("TMUX")
                .output();
        }
    }
}
