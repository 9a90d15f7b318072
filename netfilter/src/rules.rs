//! The rules of one gate: its chains in the nftables table `inet tardi` (shared by the gates
//! of a namespace), plus (on kernels without `nft_queue`) two chains of its own in
//! iptables-nft's `security` table.
//!
//! # Layout
//! Table `inet tardi`, base chains `forward`, `input`, `output` at priority `filter + 10` (after
//! the usual `filter` rules), shared by every gate of the namespace. Per gate (`<if>` = its
//! host-side interface):
//! - `forward`: `iifname <if> jump out_<if>`, `oifname <if> jump in_<if>`; `input`:
//!   `iifname <if> jump out_<if>`; `output`: `oifname <if> jump in_<if>`;
//! - `out_<if>` holds the mode's rule, `in_<if>` the input hold's rule; the named counter
//!   `dropped_<if>` counts what the mode drops.
//!
//! Why one shared table: unregistering *any* netfilter hook in a namespace makes the kernel drop
//! every packet queued in every NFQUEUE of that namespace (`nf_queue_nf_hook_drop(net)`, since
//! Linux 4.13). Per-gate base chains would make one gate's removal discard the output the other
//! gates hold; rules and regular chains come and go without touching hooks. The base chains go
//! with the last gate. (The same holds for anyone's rule reload that deletes base chains: held
//! output is lost then, dropped, never leaked.)
//!
//! Native backend (`CONFIG_NFT_QUEUE`): `out_<if>`/`in_<if>` queue with `queue num N` themselves.
//!
//! Xtables backend (this machine's kernel: `CONFIG_NFT_QUEUE` unset, but
//! `CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y` and `CONFIG_NFT_COMPAT=y`): the xtables `NFQUEUE`
//! target, through `iptables-nft`, in chains `TARDI-OUT-<if>` / `TARDI-IN-<if>` of the
//! `ip security` table, jumped to from its FORWARD+INPUT / FORWARD+OUTPUT chains. The
//! `security` table's base chains run at priority 150 (as iptables-nft creates them; 50 with
//! legacy iptables), after `filter` (0) and after our table (10):
//! - an admin's `filter` rules are all evaluated before a packet is queued (an `ACCEPT` there
//!   cannot let a packet skip the gate, and a reinjected packet does not skip them: a verdict
//!   resumes at the next hook, not at the next rule);
//! - our table's `drop` (Drop mode) acts before the queue.
//!
//! iptables-nft creates the `security` table and its built-in chains on first use; what it
//! created for us goes again once no gate uses it (see `tidy_security`).
//!
//! The xtables target covers IPv4 only, so in Hold mode `out_<if>` drops the sandbox's IPv6
//! (sandboxes are IPv4-only; never leaking is what matters), and so does `in_<if>` while input
//! is held.

use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::Mode;
use crate::cmd::Netns;
use crate::error::{NetfilterError, Result};

/// How packets are queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// nftables' own `queue` statement (`CONFIG_NFT_QUEUE`).
    Native,
    /// The xtables `NFQUEUE` target through `iptables-nft` (`CONFIG_NFT_COMPAT`).
    Xtables,
}

/// Serializes this process's rule changes: one gate's tidying must not delete a shared table
/// while another gate of the process is adding to it. (Other processes changing `inet tardi` or
/// `ip security` in the same namespace at the same moment are not covered.)
static RULES: Mutex<()> = Mutex::new(());

fn rules_lock() -> MutexGuard<'static, ()> {
    RULES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per network namespace (see [`Netns::id`]): the chains `ip security` had before this
/// process's first gate added to it; `None`: there was no such table.
type SecurityBefore = Vec<((u64, u64), Option<Vec<String>>)>;
static SECURITY_BEFORE: Mutex<SecurityBefore> = Mutex::new(Vec::new());

fn lock_before() -> MutexGuard<'static, SecurityBefore> {
    SECURITY_BEFORE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared table and its base chains (hook, priority).
const TABLE: &str = "tardi";
const BASE_CHAINS: [&str; 3] = ["forward", "input", "output"];
const PRIORITY: &str = "filter + 10";

/// The installed rules of one gate.
#[derive(Debug)]
pub(crate) struct Rules {
    ns: Netns,
    host_if: String,
    /// nft chains and counter of this gate.
    out: String,
    inp: String,
    counter: String,
    /// xtables chains of this gate.
    xt_out: String,
    xt_in: String,
    out_queue: u16,
    in_queue: u16,
    backend: Backend,
    removed: bool,
}

/// An interface name the rules can quote safely: what Linux allows, minus the characters
/// that would need escaping in nft or iptables syntax.
pub(crate) fn check_ifname(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(NetfilterError::InvalidConfig(format!(
            "interface name {name:?}: expected 1 to 15 characters out of A-Z a-z 0-9 _ - ."
        )))
    }
}

impl Rules {
    /// Installs the rules for `host_if` in the namespace `ns`, replacing leftovers of an
    /// earlier gate on the same interface (same chain names: ours). The queues must be bound
    /// already, so that no packet finds them unbound (it would be dropped: safe, but lost).
    pub(crate) fn install(
        ns: Netns,
        host_if: &str,
        out_queue: u16,
        in_queue: u16,
        mode: Mode,
    ) -> Result<Rules> {
        check_ifname(host_if)?;
        let backend = probe(&ns, out_queue)?;
        tracing::debug!(host_if, ?backend, "queue backend");
        let mut rules = Rules {
            ns,
            host_if: host_if.to_string(),
            out: format!("out_{host_if}"),
            inp: format!("in_{host_if}"),
            counter: format!("dropped_{host_if}"),
            xt_out: format!("TARDI-OUT-{host_if}"),
            xt_in: format!("TARDI-IN-{host_if}"),
            out_queue,
            in_queue,
            backend,
            removed: false,
        };
        if let Err(e) = rules.install_all(mode) {
            // Undo what got in; `Drop` would too, but report the first error, not this one's.
            rules.removed = true;
            if let Err(undo) = rules.remove_all() {
                tracing::warn!(error = %undo, "removing half-installed gate rules");
            }
            return Err(e);
        }
        Ok(rules)
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    fn install_all(&mut self, mode: Mode) -> Result<()> {
        let _lock = rules_lock();
        // Leftovers of a gate that died without cleaning up (same names: ours).
        self.remove_nft(false)?;
        if self.backend == Backend::Xtables {
            self.remove_xtables()?;
            self.note_security_before()?;
        }
        let (t, i, o, n, c) = (TABLE, &self.host_if, &self.out, &self.inp, &self.counter);
        // Declaring the table and its base chains is a no-op where they exist.
        let mut script = format!("table inet {t} {{\n");
        for hook in BASE_CHAINS {
            script += &format!(
                "chain {hook} {{\ntype filter hook {hook} priority {PRIORITY}; policy accept;\n}}\n"
            );
        }
        script += &format!(
            "counter {c} {{\n}}\nchain {o} {{\n{}\n}}\nchain {n} {{\n}}\n}}\n",
            self.out_rule(mode).unwrap_or_default()
        );
        script += &format!(
            "add rule inet {t} forward iifname \"{i}\" jump {o}\n\
             add rule inet {t} forward oifname \"{i}\" jump {n}\n\
             add rule inet {t} input iifname \"{i}\" jump {o}\n\
             add rule inet {t} output oifname \"{i}\" jump {n}\n"
        );
        self.ns.run("nft", &["-f", "-"], &script)?;
        if self.backend == Backend::Xtables {
            let (o, n, q) = (&self.xt_out, &self.xt_in, self.out_queue);
            let mut script = format!(
                "*security\n:{o} - [0:0]\n:{n} - [0:0]\n\
                 -I FORWARD 1 -i {i} -j {o}\n-I INPUT 1 -i {i} -j {o}\n\
                 -I FORWARD 1 -o {i} -j {n}\n-I OUTPUT 1 -o {i} -j {n}\n"
            );
            if mode != Mode::Pass {
                script += &format!("-A {o} -j NFQUEUE --queue-num {q}\n");
            }
            script += "COMMIT\n";
            self.ns
                .run("iptables-nft-restore", &["--noflush"], &script)?;
        }
        Ok(())
    }

    /// The rule of `out_<if>` in `mode`, if any.
    fn out_rule(&self, mode: Mode) -> Option<String> {
        let c = &self.counter;
        match (mode, self.backend) {
            (Mode::Pass, _) => None,
            (Mode::Drop, _) => Some(format!("counter name \"{c}\" drop")),
            (Mode::Hold, Backend::Native) => Some(format!("queue num {}", self.out_queue)),
            (Mode::Hold, Backend::Xtables) => {
                Some(format!("meta nfproto ipv6 counter name \"{c}\" drop"))
            }
        }
    }

    /// The rule of `in_<if>` while input is held (`hold`), if any.
    fn in_rule(&self, hold: bool) -> Option<String> {
        match (hold, self.backend) {
            (false, _) => None,
            (true, Backend::Native) => Some(format!("queue num {}", self.in_queue)),
            (true, Backend::Xtables) => Some("meta nfproto ipv6 drop".into()),
        }
    }

    /// Replaces the contents of our nft chain `chain` with `rule` (one transaction).
    fn set_nft_chain(&self, chain: &str, rule: Option<String>) -> Result<()> {
        let mut script = format!("flush chain inet {TABLE} {chain}\n");
        if let Some(r) = rule {
            script += &format!("add rule inet {TABLE} {chain} {r}\n");
        }
        self.ns.run("nft", &["-f", "-"], &script).map(drop)
    }

    /// Replaces the contents of xtables chain `chain` (one transaction): queue to `queue`, or
    /// nothing.
    fn set_xt_chain(&self, chain: &str, queue: Option<u16>) -> Result<()> {
        let _lock = rules_lock();
        // Declaring an existing chain in a `--noflush` restore flushes it.
        let mut script = format!("*security\n:{chain} - [0:0]\n");
        if let Some(q) = queue {
            script += &format!("-A {chain} -j NFQUEUE --queue-num {q}\n");
        }
        script += "COMMIT\n";
        self.ns
            .run("iptables-nft-restore", &["--noflush"], &script)
            .map(drop)
    }

    /// Switches the output rules to `mode`. Tightening steps come first: from Hold to Drop the
    /// drop rule is in before anything else changes.
    pub(crate) fn set_mode(&self, from: Mode, to: Mode) -> Result<()> {
        self.set_nft_chain(&self.out, self.out_rule(to))?;
        // The xtables queue stays in Drop mode (the drop comes first) and goes in Pass: a
        // switch between Hold and Drop leaves it alone (each rule change costs 10-30 ms here).
        if self.backend == Backend::Xtables && (from == Mode::Pass) != (to == Mode::Pass) {
            let queue = (to != Mode::Pass).then_some(self.out_queue);
            self.set_xt_chain(&self.xt_out, queue)?;
        }
        Ok(())
    }

    /// Queues (or stops queueing) packets to the sandbox.
    pub(crate) fn set_input_hold(&self, hold: bool) -> Result<()> {
        self.set_nft_chain(&self.inp, self.in_rule(hold))?;
        if self.backend == Backend::Xtables {
            self.set_xt_chain(&self.xt_in, hold.then_some(self.in_queue))?;
        }
        Ok(())
    }

    /// Packets dropped by the mode's rules so far (the named counter `dropped_<if>`).
    pub(crate) fn dropped_by_rules(&self) -> Result<u64> {
        let out = self.ns.run(
            "nft",
            &["list", "counter", "inet", TABLE, &self.counter],
            "",
        )?;
        // "... counter dropped {\n\t\tpackets 12 bytes 3456\n ..."
        let packets = out
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok());
        packets.ok_or_else(|| NetfilterError::Command {
            command: format!("nft list counter inet {TABLE} {}", self.counter),
            status: "unexpected output".into(),
            stderr: out.clone(),
        })
    }

    /// Removes every rule, chain and table this gate created. Idempotent.
    pub(crate) fn remove(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        self.remove_all()
    }

    fn remove_all(&self) -> Result<()> {
        let _lock = rules_lock();
        // The xtables part first: with our nft chains gone first, in Hold mode the sandbox's
        // IPv6 would pass for a moment.
        let xt = if self.backend == Backend::Xtables {
            self.remove_xtables().and_then(|()| self.tidy_security())
        } else {
            Ok(())
        };
        let nft = self.remove_nft(true);
        xt.and(nft)
    }

    /// Deletes our jumps, chains and counter from `inet tardi`, found in its listing (so
    /// leftovers and duplicates go too); with `tidy`, the table too once no gate uses it.
    fn remove_nft(&self, tidy: bool) -> Result<()> {
        let Ok(listing) = self
            .ns
            .run("nft", &["-a", "list", "table", "inet", TABLE], "")
        else {
            return Ok(()); // no table
        };
        let ours = |name: &str| name == self.out || name == self.inp;
        let mut script = String::new();
        let mut chain = "";
        for line in listing.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[..] {
                ["chain", name, "{", ..] => chain = name,
                ["counter", name, "{", ..] if name == self.counter => {
                    // After the rules that use it (below), in the same transaction.
                }
                _ => {
                    // A rule: `... jump out_<if> # handle N`.
                    let jumps_to_ours = w
                        .iter()
                        .position(|x| *x == "jump")
                        .and_then(|j| w.get(j + 1))
                        .is_some_and(|t| ours(t));
                    let handle = w
                        .iter()
                        .position(|x| *x == "handle")
                        .and_then(|h| w.get(h + 1));
                    if let (true, Some(h)) = (jumps_to_ours && !ours(chain), handle) {
                        script += &format!("delete rule inet {TABLE} {chain} handle {h}\n");
                    }
                }
            }
        }
        let chains = chains_of(&listing);
        for c in [&self.out, &self.inp] {
            if chains.contains(c) {
                script += &format!("flush chain inet {TABLE} {c}\ndelete chain inet {TABLE} {c}\n");
            }
        }
        if listing.lines().any(|l| {
            l.split_whitespace()
                .take(2)
                .eq(["counter", self.counter.as_str()])
        }) {
            script += &format!("delete counter inet {TABLE} {}\n", self.counter);
        }
        if !script.is_empty() {
            self.ns.run("nft", &["-f", "-"], &script)?;
        }
        let others = chains
            .iter()
            .any(|c| !BASE_CHAINS.contains(&c.as_str()) && !ours(c));
        if tidy && !others {
            // The last gate: the base chains go (unregistering hooks flushes every queue of the
            // namespace, but no gate holds anything any more).
            self.ns
                .run("nft", &["delete", "table", "inet", TABLE], "")?;
        }
        Ok(())
    }

    /// Deletes every jump to our two xtables chains and the chains themselves, found in
    /// `iptables-nft-save` (so leftovers and duplicates go too).
    fn remove_xtables(&self) -> Result<()> {
        let exists = self
            .ns
            .run("nft", &["list", "table", "ip", "security"], "")
            .is_ok();
        if !exists {
            return Ok(());
        }
        let saved = self.ns.run("iptables-nft-save", &["-t", "security"], "")?;
        let ours = |chain: &str| chain == self.xt_out || chain == self.xt_in;
        let mut script = String::from("*security\n");
        let mut changes = 0;
        for line in saved.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["-A", chain, .., "-j", target] = words[..]
                && ours(target)
                && !ours(chain)
            {
                script += &format!("-D {}\n", &line[3..]);
                changes += 1;
            }
        }
        for chain in [&self.xt_out, &self.xt_in] {
            if saved.lines().any(|l| l.starts_with(&format!(":{chain} "))) {
                // A chain must be empty to be deleted; declaring it flushes it.
                script += &format!(":{chain} - [0:0]\n-X {chain}\n");
                changes += 1;
            }
        }
        if changes > 0 {
            script += "COMMIT\n";
            self.ns
                .run("iptables-nft-restore", &["--noflush"], &script)?;
        }
        Ok(())
    }

    /// Records what `ip security` holds before this process's first gate in the namespace adds
    /// to it (a later gate finds the first one's chains there and keeps the record).
    fn note_security_before(&self) -> Result<()> {
        let listing = self
            .ns
            .run("nft", &["list", "table", "ip", "security"], "")
            .ok();
        let chains = listing.as_deref().map(chains_of);
        let in_use = chains
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.starts_with("TARDI-")));
        let id = self.ns.id()?;
        let mut before = lock_before();
        match before.iter_mut().find(|(ns, _)| *ns == id) {
            Some(_) if in_use => {}
            Some(entry) => entry.1 = chains,
            // Gates of another process, or leftovers: nothing here is provably ours to delete.
            None if in_use => before.push((id, chains.or_else(|| Some(Vec::new())))),
            None => before.push((id, chains)),
        }
        Ok(())
    }

    /// Once no gate uses `ip security` any more, deletes the parts of it that iptables-nft
    /// created for the gates and that are empty now: the whole table if it did not exist
    /// before the first gate, else the built-in chains that did not. (Someone adding a rule to
    /// one of them between the check and the delete would lose it; nobody else uses a table or
    /// chain that did not exist before the gates.)
    fn tidy_security(&self) -> Result<()> {
        let Ok(table) = self.ns.run("nft", &["list", "table", "ip", "security"], "") else {
            return Ok(());
        };
        if chains_of(&table).iter().any(|c| c.starts_with("TARDI-")) {
            return Ok(()); // another gate's
        }
        let id = self.ns.id()?;
        let before = {
            let mut all = lock_before();
            let Some(i) = all.iter().position(|(ns, _)| *ns == id) else {
                return Ok(()); // not known to be ours
            };
            all.swap_remove(i).1
        };
        let saved = self.ns.run("iptables-nft-save", &["-t", "security"], "")?;
        let has_rules = |chain: &str| {
            saved
                .lines()
                .any(|l| l.starts_with(&format!("-A {chain} ")))
        };
        let builtin = ["INPUT", "FORWARD", "OUTPUT"];
        let empty = |chain: &str| !has_rules(chain) && saved.contains(&format!(":{chain} ACCEPT "));
        let user_chains = saved.lines().any(|l| {
            l.starts_with(':') && !builtin.iter().any(|b| l.starts_with(&format!(":{b} ")))
        });
        match &before {
            None if !user_chains && builtin.iter().all(|c| empty(c)) => {
                self.ns
                    .run("nft", &["delete", "table", "ip", "security"], "")?;
            }
            None => {}
            Some(before) => {
                for chain in builtin {
                    if !before.iter().any(|c| c == chain)
                        && chains_of(&table).iter().any(|c| c == chain)
                        && empty(chain)
                    {
                        self.ns
                            .run("nft", &["delete", "chain", "ip", "security", chain], "")?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Rules {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::error!(error = %e, host_if = %self.host_if, "removing the gate's rules");
        }
    }
}

/// The chain names in an `nft list table` listing (lines `chain NAME {`).
fn chains_of(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("chain"), Some(name), Some("{")) => Some(name.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// Native when `nft` accepts a `queue` statement (checked with `nft -c`: the kernel validates
/// the transaction, nothing is committed), else Xtables. The kernel's answer does not change,
/// so it is asked once per process.
fn probe(ns: &Netns, queue: u16) -> Result<Backend> {
    static PROBED: OnceLock<Backend> = OnceLock::new();
    if let Some(b) = PROBED.get() {
        return Ok(*b);
    }
    let script = format!("table inet tardi_probe {{\nchain c {{\nqueue num {queue}\n}}\n}}\n");
    let backend = match ns.run("nft", &["-c", "-f", "-"], &script) {
        Ok(_) => Backend::Native,
        Err(NetfilterError::Command { stderr, .. }) => {
            tracing::debug!(stderr = %stderr.trim(), "no native nft queue; using iptables-nft");
            Backend::Xtables
        }
        Err(e) => return Err(e),
    };
    Ok(*PROBED.get_or_init(|| backend))
}
