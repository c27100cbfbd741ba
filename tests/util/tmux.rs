//! The tmux servers of one test: `default` and the daemon's own
//! `omniconflux`, on the test's own socket directory (`TMUX_TMPDIR`), never
//! the machine's, and killed when the test ends.

use std::path::{Path, PathBuf};
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

    /// Starts a fake Claude Code (tests/fixtures/tmux/claude) in session
    /// `work` of the `default` server, 100x30, in `proj`, and writes its
    /// transcript where the real one keeps it for HOME `home`: a turn that
    /// ended. Returns the transcript's path.
    pub fn fake_claude(&self, home: &Path, proj: &Path) -> PathBuf {
        let project = home.join(".claude/projects").join(
            proj.display()
                .to_string()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect::<String>(),
        );
        std::fs::create_dir_all(&project).unwrap();
        let transcript = project.join("0b6f0d8e-1111-4222-8333-944455556666.jsonl");
        std::fs::write(
            &transcript,
            concat!(
                r#"{"type":"user","message":{"role":"user","content":"hi"},"sessionId":"0b6f0d8e-1111-4222-8333-944455556666"}"#,
                "\n",
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn"}}"#,
                "\n"
            ),
        )
        .unwrap();
        let (proj, claude) = (proj.display().to_string(), super::fixture("tmux/claude"));
        self.tmux(
            "default",
            &[
                "new-session",
                "-d",
                "-s",
                "work",
                "-x",
                "100",
                "-y",
                "30",
                "-c",
                &proj,
                "--",
                &claude,
            ],
        );
        transcript
    }

    /// What a daemon needs to see these servers and the fake Claude Code:
    /// HOME `home`, their TMUX_TMPDIR, and the fixture's `claude` first on
    /// PATH.
    pub fn daemon_env(&self, home: &Path) -> Vec<(String, String)> {
        vec![
            ("HOME".into(), home.display().to_string()),
            ("TMUX_TMPDIR".into(), self.tmpdir.display().to_string()),
            (
                "PATH".into(),
                format!(
                    "{}:{}",
                    super::fixture("tmux"),
                    std::env::var("PATH").unwrap_or_default()
                ),
            ),
        ]
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
