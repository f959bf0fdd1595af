//! The daemon's caches are private to its uid: made 0700 (folders) and 0600 (files) whatever
//! the umask, so that another uid reads neither a dataset's names nor its objects there; and a
//! cache folder another uid owns (where it could plant an index) is not used.

use super::*;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn index_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().ends_with(".bin"))
                .collect()
        })
        .unwrap_or_default()
}

/// Starts a daemon (umask 022, `$XDG_CACHE_HOME` = `<top>/cache`) and serves one epoch of
/// `data` to this process, so that the daemon writes the dataset's index cache.
fn serve_once(top: &Path, data: &Path, log: &Path) {
    let daemon = Daemon::start_logged_with(top, &["--threads", "1"], log, |cmd| {
        // SAFETY: umask is async-signal-safe and touches no memory.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0o022);
                Ok(())
            })
        };
    });
    let mut c = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), "cache", 0, 1, spec(2, 16, Some(1))),
    )
    .unwrap();
    assert!(!drain(&mut c).is_empty());
}

#[test]
fn the_index_cache_is_private_and_another_uid_reads_nothing_of_it() {
    if !child::can_run_as_other_uid(
        "the_index_cache_is_private_and_another_uid_reads_nothing_of_it",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = top.join("data");
    write_image_folder(&data, 2, 3, 24);
    serve_once(top, &data, &top.join("stokerd.log"));
    let cache = top.join("cache/stoker");
    let files = index_files(&cache);
    assert_eq!(files.len(), 1, "one index cache in {}", cache.display());
    let modes = [top.join("cache"), cache.clone(), files[0].clone()].map(|p| mode(&p));
    assert_eq!(
        modes.map(|m| format!("{m:o}")),
        ["700", "700", "600"],
        "cache folders and the index file"
    );
    // A real process of another uid tries to list the folder and read the index.
    for (cmd, arg) in [("ls", &cache), ("cat", &files[0])] {
        let mut c = Command::new(cmd);
        c.arg(arg);
        let out = child::as_other_uid(&mut c).output().unwrap();
        assert!(
            !out.status.success(),
            "uid {OTHER_UID} ran {cmd} {}: {}",
            arg.display(),
            child::output_text(&out)
        );
    }
}

#[test]
fn a_cache_folder_of_another_uid_is_not_used_and_the_log_says_why() {
    if !child::can_run_as_other_uid(
        "a_cache_folder_of_another_uid_is_not_used_and_the_log_says_why",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let data = top.join("data");
    write_image_folder(&data, 2, 3, 24);
    // Another user made the daemon's cache folder first, to plant an index in it later.
    let cache = top.join("cache/stoker");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&cache, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let log = top.join("stokerd.log");
    serve_once(top, &data, &log);
    assert_eq!(index_files(&cache), Vec::<std::path::PathBuf>::new());
    let text = read_log(&log);
    let line = text
        .lines()
        .find(|l| l.contains(&format!("belongs to uid {OTHER_UID}")))
        .unwrap_or_else(|| panic!("no line says why the cache was refused:\n{text}"));
    assert!(line.contains(&cache.display().to_string()), "{line}");
}
