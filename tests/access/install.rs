//! docs/operations.md's install, followed as written: the "Install" and "Without systemd"
//! shell blocks run line by line as root (the `sudo` dropped, the `cargo build` replaced by
//! this build's binaries) in a private mount namespace (copies of `/etc` and `/usr/bin`, fresh
//! `/run` and `/var/cache`, so the host is untouched), after which user `alice` (added to
//! `stoker-clients` by the doc's last step) trains through the default socket rule, root and
//! the service user get `stoker status`, and `bob` (in no group) is refused loudly by the
//! system socket, with no daemon of his own started.

use super::*;
use std::process::Command;

const DOC: &str = "docs/operations.md";

/// The shell lines of the first fenced `sh` block after the heading `heading` in `doc`.
fn shell_block(doc: &str, heading: &str) -> Vec<String> {
    let after = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{DOC} has no heading {heading:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("\n```"))
        .unwrap_or_else(|| panic!("{DOC}: no ```sh block under {heading:?}"))
        .0;
    block.lines().map(str::to_owned).collect()
}

/// The doc's steps as root runs them: `sudo ` dropped, the build step replaced by copying
/// this build's `stokerd` and `stoker` to `target/release/` (the doc's next step installs
/// them from there).
fn steps_as_root(doc: &str) -> Vec<String> {
    let mut lines = shell_block(doc, "## Install");
    lines.extend(shell_block(doc, "### Without systemd"));
    let build = lines
        .iter()
        .position(|l| l.starts_with("cargo build --release"))
        .unwrap_or_else(|| panic!("{DOC}'s install no longer builds with cargo: {lines:?}"));
    let bin = stoker_testkit::stokerd_path();
    lines[build] = format!(
        "mkdir -p target/release && cp {} {} target/release/",
        bin.display(),
        bin.with_file_name("stoker").display()
    );
    lines
        .into_iter()
        .map(|l| l.strip_prefix("sudo ").map(str::to_owned).unwrap_or(l))
        .collect()
}

/// The script run in the namespace: the sandbox, the doc's steps, then the users' checks.
fn script(top: &Path, steps: &[String]) -> String {
    let t = top.display();
    let client = stoker_testkit::client_process::test_client_path();
    let user = |who: &str, cmd: &str| {
        format!("setpriv --reuid={who} --regid={who} --init-groups env -u XDG_RUNTIME_DIR {cmd}")
    };
    let train = client.display().to_string() + " train - imagenet";
    format!(
        r#"set -eu
mount --make-rprivate /
cp -a /etc {t}/etc && mount --bind {t}/etc /etc
mkdir {t}/up {t}/work && mount -t overlay overlay -o lowerdir=/usr/bin,upperdir={t}/up,workdir={t}/work /usr/bin
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/cache
useradd --no-create-home --home-dir /nonexistent alice
useradd --no-create-home --home-dir /nonexistent bob
stop() {{ pid=$(stoker status --json 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\),*$/\1/p'); [ -n "$pid" ] && kill $pid; }}
trap stop EXIT
cd {t}/checkout
set -x
{steps}
set +x
echo "== root"; stoker status 2>&1 || echo "exit $?"
echo "== stoker"; {stoker_status} 2>&1 || echo "exit $?"
echo "== alice"; {alice} 2>&1 || echo "exit $?"
echo "== bob"; {bob} 2>&1 || echo "exit $?"
echo "== bob status"; {bob_status} 2>&1 || echo "exit $?"
echo "== bob's own socket"; ls /tmp/stoker-$(id -u bob)/stoker.sock 2>&1 || true
echo "== end"
"#,
        steps = steps.join("\n"),
        stoker_status = user("stoker", "stoker status"),
        alice = user("alice", &train),
        bob = user("bob", &train),
        bob_status = user("bob", "stoker status"),
    )
}

/// What the script said between `== name` and the next `==` line.
fn said<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("== {name}\n"))
        .unwrap_or_else(|| panic!("no {name:?} section:\n{out}"));
    let rest = &out[start + name.len() + 4..];
    &rest[..rest.find("\n== ").unwrap_or(rest.len())]
}

/// The checkout the doc's commands run in: `deploy/` and a dataset, with the example config
/// edited as the doc says ("then edit it"): the dataset `imagenet` registered.
fn checkout(top: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deploy = top.join("checkout/deploy");
    std::fs::create_dir_all(&deploy).unwrap();
    let data = top.join("data");
    write_image_folder(&data, 2, 4, 24);
    let example = std::fs::read_to_string(repo.join("deploy/stoker.toml.example")).unwrap();
    let commented = "# imagenet = \"/data/imagenet/train\"";
    assert!(
        example.contains(commented),
        "the example config lost {commented:?}"
    );
    let edited = example.replace(commented, &format!("imagenet = \"{}\"", data.display()));
    std::fs::write(deploy.join("stoker.toml.example"), edited).unwrap();
    for p in [top, &top.join("checkout")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Whether this host lets root make a private mount namespace with an overlay; SKIPPED if not.
fn can_sandbox(test: &str) -> bool {
    if !child::can_run_as_other_uid(test) {
        return false;
    }
    let ok = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /mnt && which setpriv useradd",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED {test}: no private mount namespace, setpriv or useradd here");
    }
    ok
}

#[test]
fn the_documented_install_without_systemd_lets_a_clients_group_member_train() {
    let test = "the_documented_install_without_systemd_lets_a_clients_group_member_train";
    if !can_sandbox(test) {
        return;
    }
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    checkout(top);
    let steps = steps_as_root(&doc);
    let path = top.join("install.sh");
    std::fs::write(&path, script(top, &steps)).unwrap();
    let out = child::output_within(
        Command::new("unshare")
            .arg("--mount")
            .arg("bash")
            .arg(&path),
        Duration::from_secs(120),
        "the documented install",
    );
    let text = child::output_text(&out);
    println!("{text}");
    assert!(out.status.success() && text.contains("== end"), "{text}");
    for who in ["root", "stoker"] {
        let s = said(&text, who);
        assert!(
            s.contains("serving on /run/stoker/stoker.sock"),
            "stoker status as {who}: {s}"
        );
    }
    let alice = said(&text, "alice");
    assert!(
        alice.contains("trained 8 images at /run/stoker/stoker.sock"),
        "alice, in stoker-clients, could not train: {alice}"
    );
    for section in ["bob", "bob status"] {
        let bob = said(&text, section);
        assert!(
            bob.contains("/run/stoker/stoker.sock")
                && bob.contains("refuses this user")
                && bob.contains("stoker-clients")
                && bob.contains("STOKER_PRIVATE_DAEMON=1"),
            "{section}: the refusal is not said loudly: {bob}"
        );
    }
    let own = said(&text, "bob's own socket");
    assert!(
        own.contains("No such file"),
        "a daemon of bob's own was started: {own}"
    );
}
