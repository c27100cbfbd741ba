//! The node's host facts and directory completion (seed 004, Host;
//! `host.completeDir` in the Sessions table): what a client shows before
//! it spawns a session in a directory of this machine.
//!
//! - [`info`]: the OS as "PRETTY_NAME (arch)" from /etc/os-release, the
//!   uptime from /proc/uptime, and the first battery of
//!   /sys/class/power_supply, absent when there is none.
//! - [`complete_dir`]: the subdirectories of `path`'s parent whose names
//!   start with its last segment, sorted, at most `COMPLETE_DIR_MAX`, each
//!   written as the parent was given, then the name and a `/`; names
//!   starting with `.` only when the segment does too; `~` is the home
//!   directory, an empty path lists it; a relative or unreadable path
//!   gives none. At most `COMPLETE_DIR_SCAN_MAX` entries are read.
//!
//! Both read files; the daemon runs them on the tmux workers.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::limits;

/// seed 004's HostInfo, less the wakelock, which the reactor holds
/// (src/tmux/wakelock.rs) and the socket's answer adds.
#[derive(Clone, Debug, PartialEq)]
pub struct Info {
    pub os: Option<String>,
    pub uptime_seconds: u64,
    pub battery: Option<Battery>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Battery {
    pub percent: u32,
    /// "charging", "discharging", "full", "not_charging" or "unknown".
    pub state: &'static str,
}

fn read_small(p: &Path) -> Option<String> {
    let f = std::fs::File::open(p).ok()?;
    let mut s = String::new();
    f.take(16 * 1024).read_to_string(&mut s).ok()?;
    Some(s)
}

pub fn info() -> Info {
    let pretty = read_small(Path::new("/etc/os-release")).and_then(|t| {
        t.lines().find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim().trim_matches('"').to_string())
        })
    });
    let os = pretty.map(|p| format!("{p} ({})", std::env::consts::ARCH));
    let uptime_seconds = read_small(Path::new("/proc/uptime"))
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| s as u64)
        .unwrap_or(0);
    Info {
        os,
        uptime_seconds,
        battery: battery(Path::new("/sys/class/power_supply")),
    }
}

/// The first power supply of type Battery under `dir`.
pub fn battery(dir: &Path) -> Option<Battery> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .take(64)
        .map(|e| e.path())
        .collect();
    names.sort();
    names.into_iter().find_map(|p| {
        if read_small(&p.join("type"))?.trim() != "Battery" {
            return None;
        }
        let percent = read_small(&p.join("capacity"))?
            .trim()
            .parse::<u32>()
            .ok()?;
        let state = match read_small(&p.join("status")).as_deref().map(str::trim) {
            Some("Charging") => "charging",
            Some("Discharging") => "discharging",
            Some("Full") => "full",
            Some("Not charging") => "not_charging",
            _ => "unknown",
        };
        Some(Battery {
            percent: percent.min(100),
            state,
        })
    })
}

/// `host.completeDir` (module comment).
pub fn complete_dir(home: &Path, path: &str) -> Vec<String> {
    let (parent_text, segment) = match path.rfind('/') {
        Some(i) => (&path[..=i], &path[i + 1..]),
        None if path.is_empty() || path == "~" => ("", ""),
        None => return Vec::new(),
    };
    // The directory to list, and how the answers begin.
    let (dir, prefix) = if path.is_empty() || path == "~" {
        (
            home.to_path_buf(),
            format!(
                "{}/",
                if path.is_empty() {
                    home.display().to_string()
                } else {
                    "~".into()
                }
            ),
        )
    } else if let Some(rest) = parent_text.strip_prefix("~/") {
        (home.join(rest), parent_text.to_string())
    } else if parent_text.starts_with('/') {
        (PathBuf::from(parent_text), parent_text.to_string())
    } else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .take(limits::COMPLETE_DIR_SCAN_MAX)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(segment) && (!n.starts_with('.') || segment.starts_with('.')))
        .collect();
    names.sort();
    names.truncate(limits::COMPLETE_DIR_MAX);
    names.into_iter().map(|n| format!("{prefix}{n}/")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_follows_the_seed_s_rules() {
        let home = std::env::temp_dir().join(format!("oc-complete-{}", std::process::id()));
        for d in ["src", "scripts", ".secret", "docs/a"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join("setup.txt"), "").unwrap();
        let h = home.display().to_string();
        assert_eq!(complete_dir(&home, "~/s"), ["~/scripts/", "~/src/"]);
        assert_eq!(
            complete_dir(&home, &format!("{h}/sc")),
            [format!("{h}/scripts/")]
        );
        // Dot names only for a dot segment.
        assert_eq!(complete_dir(&home, "~/."), ["~/.secret/"]);
        assert_eq!(complete_dir(&home, "~/").len(), 3);
        assert_eq!(complete_dir(&home, "~/docs/"), ["~/docs/a/"]);
        // An empty path lists the home directory.
        assert_eq!(complete_dir(&home, "").len(), 3);
        assert!(complete_dir(&home, "").iter().all(|p| p.starts_with(&h)));
        assert_eq!(complete_dir(&home, "~").len(), 3);
        // Relative or unreadable: nothing.
        assert!(complete_dir(&home, "docs/").is_empty());
        assert!(complete_dir(&home, "src").is_empty());
        assert!(complete_dir(&home, "/does/not/exist/x").is_empty());
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn a_battery_is_read_from_its_power_supply_files() {
        let dir = std::env::temp_dir().join(format!("oc-battery-{}", std::process::id()));
        let ac = dir.join("AC");
        let bat = dir.join("BAT0");
        std::fs::create_dir_all(&ac).unwrap();
        std::fs::create_dir_all(&bat).unwrap();
        std::fs::write(ac.join("type"), "Mains\n").unwrap();
        assert_eq!(battery(&dir), None);
        std::fs::write(bat.join("type"), "Battery\n").unwrap();
        std::fs::write(bat.join("capacity"), "87\n").unwrap();
        std::fs::write(bat.join("status"), "Not charging\n").unwrap();
        assert_eq!(
            battery(&dir),
            Some(Battery {
                percent: 87,
                state: "not_charging"
            })
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
