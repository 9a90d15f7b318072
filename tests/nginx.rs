//! Debian's unmodified nginx (`apt-get install nginx-light`) under the shipped manifest
//! (`gramine-manifests/nginx.manifest`): a master and two workers sharing the listening socket,
//! the master's channels to its workers (unix socket pairs) and the shared memory zone the
//! master maps before it forks them. Pages are fetched and both workers answer; `tardi
//! snapshot`, kill, `tardi restore`: the master and both workers are back with their PIDs, the
//! same pages are served and both workers answer again; then the restored master still
//! commands its workers: a reload (SIGHUP) replaces them with new ones, which serve.

mod common;

use common::tardi::{Running, Scratch};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tardi_checkpointer::image::{Backing, ShmId};

const PORT: u16 = 8080;

/// The shipped manifest with the configuration mounted from this checkout, a unique name and
/// a scratch data directory.
fn manifest(scratch: &Path, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_with(scratch, name, &root.join("gramine-manifests/nginx"))
}

/// [`manifest`] with the configuration and site in `conf` (mounted at `/srv/nginx`).
fn manifest_with(scratch: &Path, name: &str, conf_dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("gramine-manifests/nginx.manifest")).unwrap();
    let (conf, data, name_line) = (
        "uri = \"file:/srv/nginx\"",
        "file:/var/lib/tardi/nginx/data",
        "name = \"nginx\"",
    );
    assert!(
        text.contains(conf) && text.contains(data) && text.contains(name_line),
        "the shipped nginx manifest changed shape: update this test"
    );
    let text = text
        .replace(
            conf,
            &format!("uri = {:?}", format!("file:{}", conf_dir.display())),
        )
        .replace(data, &format!("file:{}", scratch.join("data").display()))
        .replace(name_line, &format!("name = {name:?}"));
    let p = scratch.join(format!("{name}.manifest"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Requests answered since the counter was last reset.
static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// `GET path` over a fresh connection: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: tardi\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    c.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    REQUESTS.fetch_add(1, Ordering::SeqCst);
    Ok((status, body.to_string()))
}

/// The request count of `/status` (nginx's `stub_status`: the requests of every worker, kept
/// in the shared memory zone), this request included.
fn requests(addr: SocketAddr) -> u64 {
    let (status, body) = get(addr, "/status").expect("GET /status");
    assert!(status.contains(" 200 "), "GET /status: {status}");
    // "Active connections: N \nserver accepts handled requests\n A H R \n..."
    body.lines()
        .nth(2)
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("GET /status: {body:?}"))
}

/// Waits until nginx answers on `addr`.
fn wait_serving(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match get(addr, "/") {
            Ok((status, _)) if status.contains(" 200 ") => return,
            r if Instant::now() > deadline => panic!("nginx does not serve on {addr}: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The site's page, as it must be served.
fn check_pages(addr: SocketAddr, when: &str) {
    let want = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("gramine-manifests/nginx/site/index.html"),
    )
    .unwrap();
    for path in ["/", "/index.html"] {
        let (status, body) = get(addr, path).unwrap_or_else(|e| panic!("{when}: GET {path}: {e}"));
        assert!(status.contains(" 200 "), "{when}: GET {path}: {status}");
        assert_eq!(body, want, "{when}: GET {path}");
    }
    let (status, _) = get(addr, "/missing").unwrap();
    assert!(status.contains(" 404 "), "{when}: GET /missing: {status}");
}

/// The PIDs (in the sandbox) of the workers that answered `/worker`, asked by eight clients
/// at once, round after round, until `want` distinct ones answered (at most 50 rounds).
fn workers(addr: SocketAddr, want: usize) -> BTreeSet<i32> {
    let mut seen = BTreeSet::new();
    for _ in 0..50 {
        let clients: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(move || get(addr, "/worker")))
            .collect();
        for c in clients {
            let (status, body) = c.join().unwrap().expect("GET /worker");
            assert!(status.contains(" 200 "), "GET /worker: {status}");
            let pid = body
                .trim()
                .strip_prefix("worker ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("GET /worker: {body:?}"));
            seen.insert(pid);
        }
        if seen.len() >= want {
            break;
        }
    }
    seen
}

/// The PIDs in the sandbox (the last of `NSpid`) of machine `m`'s nginx processes.
fn nginx_pids_on(c: &common::cluster::Cluster, m: &str) -> BTreeSet<i32> {
    c.service_pids(m, "nginx")
        .into_iter()
        .filter_map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))?
                .split_whitespace()
                .last()?
                .parse()
                .ok()
        })
        .collect()
}

/// What each nginx process of machine `m` is doing (state, wait channel, system call, its
/// descriptors), for a failure's message.
fn processes(c: &common::cluster::Cluster, m: &str) -> String {
    let mut out = String::new();
    for pid in c.service_pids(m, "nginx") {
        let read =
            |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let state = read("status")
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or_default()
            .to_string();
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .map(|e| {
                        let to = std::fs::read_link(e.path()).unwrap_or_default();
                        format!("{}->{}", e.file_name().to_string_lossy(), to.display())
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "pid {pid} {} {state} wchan {} syscall {} fds {fds:?}\n",
            read("comm").trim(),
            read("wchan"),
            read("syscall").trim()
        ));
        for f in fds.iter().filter(|f| f.contains("eventpoll")) {
            let n = f.split("->").next().unwrap_or_default();
            out.push_str(&format!("  epoll {n}: {}\n", read(&format!("fdinfo/{n}"))));
        }
    }
    out
}

/// The tree under host PID `root`: (PID in the sandbox, host PID) of each process, the root
/// first, then its children.
fn tree(root: i32) -> Vec<(i32, i32)> {
    let ns = |p: i32| -> i32 {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let kids =
        std::fs::read_to_string(format!("/proc/{root}/task/{root}/children")).unwrap_or_default();
    std::iter::once((ns(root), root))
        .chain(
            kids.split_whitespace()
                .filter_map(|k| k.parse().ok())
                .map(|k| (ns(k), k)),
        )
        .collect()
}

fn sandbox_pids(t: &[(i32, i32)]) -> Vec<i32> {
    t.iter().map(|p| p.0).collect()
}

#[test]
fn nginx_master_and_workers_survive_snapshot_and_restore() {
    assert!(
        Path::new("/usr/sbin/nginx").exists(),
        "nginx is not installed (scripts/setup.sh: apt-get install nginx-light)"
    );
    let scratch = Scratch::new("nginx");
    let name = format!("nginx-{}", std::process::id() % 10000);
    let m = manifest(&scratch.0, &name);
    let cur = Running::run(&m).expect("tardi run nginx");
    let addr = cur.addr(PORT);
    wait_serving(addr);
    check_pages(addr, "before the snapshot");
    let served = workers(addr, 2);
    let before = tree(cur.pid);
    assert_eq!(before.len(), 3, "a master and two workers: {before:?}");
    let worker_pids: BTreeSet<i32> = before[1..].iter().map(|p| p.0).collect();
    assert_eq!(served, worker_pids, "both workers answer");

    // The zone counts every request, whichever worker served it.
    REQUESTS.store(0, Ordering::SeqCst);
    let first = requests(addr);
    workers(addr, 2);
    let counted = requests(addr);
    assert_eq!(
        counted,
        first + REQUESTS.load(Ordering::SeqCst) - 1,
        "the shared counters count both workers' requests"
    );

    let file = scratch.0.join("nginx.tardi");
    let image = cur.snapshot_image(&file, "snapshot of nginx");
    assert_eq!(image.tree.len(), 2, "two workers besides the master");
    // The listening socket, one description held by all three.
    let listener = common::tardi::shared_listener(&image);
    assert_eq!(listener.holders.len(), 3, "{:?}", listener.holders);
    // The master's shared zone (accept mutex, connection counters), mapped by the workers.
    let zone = image
        .shm
        .iter()
        .find(|o| matches!(o.id, ShmId::Anon(_)))
        .map(|o| o.id)
        .expect("nginx's shared memory zone");
    for m in &image.tree {
        assert!(
            m.image.vmas.iter().any(|v| v.backing
                == Backing::Shm {
                    id: zone,
                    offset: 0
                }),
            "worker {} maps the zone",
            m.image.pid
        );
    }
    let log = cur.log.clone();
    cur.stop();

    REQUESTS.store(0, Ordering::SeqCst);
    let restored = Running::restore_or_log(&file, &log);
    let addr = restored.addr(PORT);
    let after = tree(restored.pid);
    assert_eq!(
        sandbox_pids(&after),
        sandbox_pids(&before),
        "the master and its workers with their PIDs"
    );
    check_pages(addr, "after the restore");
    assert_eq!(
        workers(addr, 2),
        worker_pids,
        "both restored workers answer"
    );
    // The zone came back with its counts and is one zone again: the requests since the
    // restore, whichever worker served them, count on from the snapshot's.
    let now = requests(addr);
    assert_eq!(
        now,
        counted + REQUESTS.load(Ordering::SeqCst),
        "the restored workers share their counters (and the snapshot's count is kept)"
    );

    // The restored master still commands its workers: a reload starts two new ones and ends
    // the old ones (reaped by the master: no process left but the three).
    // SAFETY: a signal to the restored master, a process this test's sandbox holds.
    assert_eq!(unsafe { libc::kill(restored.pid, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let reloaded = loop {
        let t = tree(restored.pid);
        let pids: BTreeSet<i32> = t[1..].iter().map(|p| p.0).collect();
        if t.len() == 3 && pids.is_disjoint(&worker_pids) {
            break pids;
        }
        assert!(
            Instant::now() < deadline,
            "after a reload: {t:?}\n--- log ---\n{}",
            std::fs::read_to_string(scratch.0.join("data/error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    check_pages(addr, "after a reload");
    assert_eq!(workers(addr, 2), reloaded, "the new workers answer");
    restored.stop();
}

/// `tardi profile --verify` on nginx under load (curl fetching pages and the request count,
/// which the workers keep in the shared memory zone, in a loop): the master and both workers
/// are tracked by the epoch loop, the zone once, in the master's image, with its pages that
/// changed in every checkpoint; at the end the image built from the chain equals the held
/// tree, shared memory included, and so does a held restore of it.
#[test]
fn nginx_profile_under_load_verifies() {
    let epochs = profile_under_load("nginx-profile", "nginx-prof", &[]);
    assert!(
        epochs.iter().all(|e| e["write_faults"].is_null()),
        "the userfaultfd tracker (the default) counts no faults itself"
    );
}

/// The same with the mprotect tracker: its agent and seccomp filter in the master (root) and in
/// both workers, which run as `www-data` (neither `CAP_SYS_ADMIN` nor `no_new_privs`: the
/// tracker sets `no_new_privs` for the filter, see `Agent::prepare_no_new_privs`). Verified,
/// with the pages the workers wrote in the checkpoints.
#[test]
fn nginx_profile_under_load_verifies_mprotect() {
    let epochs = profile_under_load(
        "nginx-profile-mp",
        "nginx-profmp",
        &["--tracker", "mprotect"],
    );
    assert!(
        epochs.iter().all(|e| e["write_faults"].is_u64()),
        "every epoch tracked by the mprotect tracker: {:?}",
        epochs.first()
    );
    let dirty: u64 = epochs
        .iter()
        .filter_map(|e| e["dirty_pages"].as_u64())
        .sum();
    assert!(
        dirty >= epochs.len() as u64,
        "{dirty} written pages in {} epochs under load",
        epochs.len()
    );
}

/// `tardi profile --verify` on nginx for 3 s while curl fetches pages and the request count in
/// a loop, with `tracker_args`: verified, with enough epochs and pages served. Returns the
/// epochs' JSON lines.
fn profile_under_load(tag: &str, prefix: &str, tracker_args: &[&str]) -> Vec<serde_json::Value> {
    assert!(
        Path::new("/usr/sbin/nginx").exists(),
        "nginx is not installed (scripts/setup.sh: apt-get install nginx-light)"
    );
    let scratch = Scratch::new(tag);
    let name = format!("{prefix}-{}", std::process::id() % 10000);
    let m = manifest(&scratch.0, &name);
    let log = scratch.0.join("load.out");
    let load = format!(
        "while :; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{{address}}:{PORT}/; \
         curl -s -o /dev/null -w '%{{http_code}}\\n' http://{{address}}:{PORT}/status; \
         done >> {}",
        log.display()
    );
    let mut lines = common::tardi::profile_verified_with(&m, &load, 3, &scratch.0, tracker_args);
    lines.pop(); // the summary
    assert!(lines.len() >= 10, "only {} epochs", lines.len());
    let served = std::fs::read_to_string(&log).unwrap_or_default();
    let ok = served.lines().filter(|l| *l == "200").count();
    // (The load is killed when the profile ends: its last request may be cut short.)
    assert!(
        ok >= 20 && ok + 2 >= served.lines().count(),
        "the load while profiling: {ok} pages served:\n{served}"
    );
    lines
}

/// Replicated nginx on the lab (`tardi deploy` with one backup; the epoch loop tracks the
/// master and both workers, their listening socket and shared zone): the primary's machine
/// loses power, and the backup's restored tree serves on: the same master and workers (their
/// PIDs in the sandbox), answering, and the request count in the shared zone going on from the
/// decided state (the requests answered before the power cut are all counted: their replies
/// waited for their epoch to be decided).
///
/// Which worker takes a connection is the kernel's choice (`EPOLLEXCLUSIVE` wakes the first
/// idle waiter of the listener): on one CPU, the restored tree's first waiter can take every
/// connection of fifty rounds while the other waits, registered and idle (seen with `taskset
/// -c 0`). So the test asks the restored processes who they are, and that the workers that
/// answer are among them, not that the balance reaches both.
#[test]
fn replicated_nginx_fails_over_to_its_backup() {
    let scratch = Scratch::new("nginx-rep");
    let name = format!("nginx-rep-{}", std::process::id() % 10000);
    let m = manifest(&scratch.0, &name);
    let mut c = common::cluster::Cluster::up(2, &[]);
    let (primary, backup, to) = c.deploy_active(&m, 1, &name, PORT);
    let (before, served) = c
        .lab
        .in_node("client", || {
            wait_serving(to);
            check_pages(to, "before the power cut");
            (requests(to), workers(to, 2))
        })
        .unwrap();
    assert_eq!(served.len(), 2, "both workers answer: {served:?}");
    // The chain held while it served (a primary whose chain breaks reports itself failed and
    // the service moves: another view).
    c.assert_first_view(&name, &primary);
    c.lab.kill(&primary).unwrap();
    let (after, served_after) = c
        .lab
        .in_node("client", || {
            wait_serving(to);
            check_pages(to, "after the failover");
            (requests(to), workers(to, 2))
        })
        .unwrap();
    let svc = c.wait_active(&name, Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    assert_ne!(svc["primary"], primary.as_str());
    assert_eq!(svc["view"].as_u64(), Some(2), "one view change: {svc}");
    let restored = nginx_pids_on(&c, &backup);
    assert!(
        served.iter().all(|w| restored.contains(w)) && restored.len() == served.len() + 1,
        "the master and the same workers run after the failover: {restored:?}, workers before \
         {served:?}\n{}",
        processes(&c, &backup)
    );
    assert!(
        !served_after.is_empty() && served_after.is_subset(&served),
        "the restored workers answer: {served_after:?} of {served:?}"
    );
    // Between the two counts: at least the pages checked after the failover (3) and the
    // /worker rounds; none of the counted requests before it is lost.
    assert!(
        after > before + 3,
        "the request count goes on from the decided state: {before} then {after}"
    );
}

/// A long HTTP download from nginx (a worker's connection, sent with `sendfile`) through a power
/// cut of the primary's machine (issue 28): the client reads slowly on one connection, the
/// backup's restored worker carries on sending where the decided checkpoint left it, and the
/// file arrives whole and byte-exact, with no reconnect.
#[test]
fn a_long_download_from_nginx_survives_a_failover() {
    use std::io::BufRead;
    let scratch = Scratch::new("nginx-dl");
    let name = format!("nginx-dl-{}", std::process::id() % 10000);
    // The shipped configuration and site, and a 16 MiB file of pseudo-random bytes beside them.
    let conf = scratch.0.join("conf");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("gramine-manifests/nginx");
    std::fs::create_dir_all(conf.join("site")).unwrap();
    std::fs::copy(shipped.join("nginx.conf"), conf.join("nginx.conf")).unwrap();
    std::fs::copy(
        shipped.join("site/index.html"),
        conf.join("site/index.html"),
    )
    .unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let file: Vec<u8> = (0..(16usize << 20) / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    std::fs::write(conf.join("site/big.bin"), &file).unwrap();
    let m = manifest_with(&scratch.0, &name, &conf);
    let mut c = common::cluster::Cluster::up(2, &[]);
    let (primary, backup, to) = c.deploy_active(&m, 1, &name, PORT);
    let stream = c
        .lab
        .in_node("client", || {
            wait_serving(to);
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            write!(
                s,
                "GET /big.bin HTTP/1.1\r\nHost: tardi\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            s
        })
        .unwrap();
    let mut r = std::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("the reply's head");
        head.push_str(&line);
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    assert!(head.starts_with("HTTP/1.1 200"), "GET /big.bin: {head}");
    // Read slowly (32 KiB every 5 ms): the download takes seconds; the power cut comes once
    // 2 MiB have arrived.
    let mut got = Vec::with_capacity(file.len());
    let mut buf = vec![0u8; 32 << 10];
    let mut killed = None;
    loop {
        let n = r.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "the download broke after {} bytes (power cut: {}): {e}\n{}",
                got.len(),
                killed.is_some(),
                c.logs()
            )
        });
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if killed.is_none() && got.len() >= 2 << 20 {
            c.assert_first_view(&name, &primary);
            c.lab.kill(&primary).unwrap();
            killed = Some(got.len());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let killed = killed.expect("the power cut came during the download");
    assert_eq!(
        got.len(),
        file.len(),
        "the whole file arrived (power cut after {killed} bytes)"
    );
    assert!(got == file, "the file arrived byte-exact");
    let svc = c.wait_active(&name, Duration::from_secs(20), |s| {
        s["primary"] == backup.as_str()
    });
    assert_eq!(svc["view"].as_u64(), Some(2), "one view change: {svc}");
}
