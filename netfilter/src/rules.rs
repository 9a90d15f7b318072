//! The rules of one gate: an nftables table of its own, plus (on kernels without `nft_queue`)
//! two chains of its own in iptables-nft's `security` table.
//!
//! # Layout
//! Table `inet tardi_<host_if>` (priority `filter + 10`, i.e. after the usual `filter` rules):
//! - `out_forward` (forward hook) and `out_input` (input hook) jump to `out` for packets
//!   *from* the sandbox (`iifname host_if`);
//! - `in_forward` (forward hook) and `in_output` (output hook) jump to `in` for packets *to*
//!   the sandbox (`oifname host_if`);
//! - `out` holds the mode's rule, `in` the input hold's rule; the named counter `dropped` counts
//!   what the mode drops.
//!
//! Native backend (`CONFIG_NFT_QUEUE`): `out`/`in` queue with `queue num N` themselves.
//!
//! Xtables backend (this machine's kernel: `CONFIG_NFT_QUEUE` unset, but
//! `CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y` and `CONFIG_NFT_COMPAT=y`): the xtables `NFQUEUE`
//! target, through `iptables-nft`, in chains `TARDI-OUT-<host_if>` / `TARDI-IN-<host_if>` of the
//! `ip security` table, jumped to from its FORWARD+INPUT / FORWARD+OUTPUT chains. The
//! `security` table's base chains run at priority 150 (as iptables-nft creates them; 50 with
//! legacy iptables), after `filter` (0) and after our table (10):
//! - an admin's `filter` rules are all evaluated before a packet is queued (an `ACCEPT` there
//!   cannot let a packet skip the gate, and a reinjected packet does not skip them: a verdict
//!   resumes at the next hook, not at the next rule);
//! - our table's `drop` (Drop mode) acts before the queue.
//!
//! iptables-nft creates the `security` table and its built-in chains on first use; what it
//! created for us goes again with the gate once empty (see `tidy_security`).
//!
//! The xtables target covers IPv4 only, so in Hold mode the `out` chain drops the sandbox's IPv6
//! (sandboxes are IPv4-only; never leaking is what matters), and so does `in` while input is
//! held.

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

/// Priority of our table's base chains.
const PRIORITY: &str = "filter + 10";

/// The installed rules of one gate.
#[derive(Debug)]
pub(crate) struct Rules {
    ns: Netns,
    host_if: String,
    table: String,
    out_chain: String,
    in_chain: String,
    out_queue: u16,
    in_queue: u16,
    backend: Backend,
    /// The chains of `ip security` before we first touched it; `None`: no such table.
    security_before: Option<Vec<String>>,
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
    /// earlier gate on the same interface (same table and chain names: ours). The queues must
    /// be bound already, so that no packet finds them unbound (it would be dropped: safe, but
    /// lost).
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
            table: format!("tardi_{host_if}"),
            out_chain: format!("TARDI-OUT-{host_if}"),
            in_chain: format!("TARDI-IN-{host_if}"),
            out_queue,
            in_queue,
            backend,
            // Settled in `install_all`, after leftovers are gone.
            security_before: None,
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
        // Leftovers of a gate that died without cleaning up (same names: ours).
        // With `security_before` still `None`, an `ip security` table holding nothing but
        // leftovers goes too.
        if self.backend == Backend::Xtables {
            self.remove_xtables()?;
            self.security_before = self
                .ns
                .run("nft", &["list", "table", "ip", "security"], "")
                .ok()
                .map(|t| chains_of(&t));
        }
        let t = &self.table;
        let i = &self.host_if;
        // `table {}` + `delete table` first: replaces a leftover table atomically, in the same
        // transaction.
        let script = format!(
            "table inet {t} {{}}\n\
             delete table inet {t}\n\
             table inet {t} {{\n\
             counter dropped {{\n}}\n\
             chain out_forward {{\ntype filter hook forward priority {PRIORITY}; policy accept;\niifname \"{i}\" jump out\n}}\n\
             chain out_input {{\ntype filter hook input priority {PRIORITY}; policy accept;\niifname \"{i}\" jump out\n}}\n\
             chain in_forward {{\ntype filter hook forward priority {PRIORITY}; policy accept;\noifname \"{i}\" jump in\n}}\n\
             chain in_output {{\ntype filter hook output priority {PRIORITY}; policy accept;\noifname \"{i}\" jump in\n}}\n\
             chain out {{\n{}\n}}\n\
             chain in {{\n}}\n\
             }}\n",
            self.out_rule(mode).unwrap_or_default()
        );
        self.ns.run("nft", &["-f", "-"], &script)?;
        if self.backend == Backend::Xtables {
            let (o, n, q) = (&self.out_chain, &self.in_chain, self.out_queue);
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

    /// The rule of chain `out` in `mode`, if any.
    fn out_rule(&self, mode: Mode) -> Option<String> {
        match (mode, self.backend) {
            (Mode::Pass, _) => None,
            (Mode::Drop, _) => Some("counter name \"dropped\" drop".into()),
            (Mode::Hold, Backend::Native) => Some(format!("queue num {}", self.out_queue)),
            (Mode::Hold, Backend::Xtables) => {
                Some("meta nfproto ipv6 counter name \"dropped\" drop".into())
            }
        }
    }

    /// The rule of chain `in` while input is held (`hold`), if any.
    fn in_rule(&self, hold: bool) -> Option<String> {
        match (hold, self.backend) {
            (false, _) => None,
            (true, Backend::Native) => Some(format!("queue num {}", self.in_queue)),
            (true, Backend::Xtables) => Some("meta nfproto ipv6 drop".into()),
        }
    }

    /// Replaces the contents of nft chain `chain` with `rule` (one transaction).
    fn set_nft_chain(&self, chain: &str, rule: Option<String>) -> Result<()> {
        let t = &self.table;
        let mut script = format!("flush chain inet {t} {chain}\n");
        if let Some(r) = rule {
            script += &format!("add rule inet {t} {chain} {r}\n");
        }
        self.ns.run("nft", &["-f", "-"], &script).map(drop)
    }

    /// Replaces the contents of xtables chain `chain` (one transaction): queue to `queue`, or
    /// nothing.
    fn set_xt_chain(&self, chain: &str, queue: Option<u16>) -> Result<()> {
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
    pub(crate) fn set_mode(&self, mode: Mode) -> Result<()> {
        self.set_nft_chain("out", self.out_rule(mode))?;
        if self.backend == Backend::Xtables {
            // The xtables queue stays in Drop mode (the drop comes first) and goes in Pass.
            let queue = (mode != Mode::Pass).then_some(self.out_queue);
            self.set_xt_chain(&self.out_chain, queue)?;
        }
        Ok(())
    }

    /// Queues (or stops queueing) packets to the sandbox.
    pub(crate) fn set_input_hold(&self, hold: bool) -> Result<()> {
        self.set_nft_chain("in", self.in_rule(hold))?;
        if self.backend == Backend::Xtables {
            self.set_xt_chain(&self.in_chain, hold.then_some(self.in_queue))?;
        }
        Ok(())
    }

    /// Packets dropped by the mode's rules so far (the named counter `dropped`).
    pub(crate) fn dropped_by_rules(&self) -> Result<u64> {
        let out = self.ns.run(
            "nft",
            &["list", "counter", "inet", &self.table, "dropped"],
            "",
        )?;
        // "... counter dropped {\n\t\tpackets 12 bytes 3456\n ..."
        let packets = out
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok());
        packets.ok_or_else(|| NetfilterError::Command {
            command: format!("nft list counter inet {} dropped", self.table),
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
        // The xtables part first: with our nft table gone first, in Hold mode the sandbox's
        // IPv6 would pass for a moment.
        let xt = if self.backend == Backend::Xtables {
            self.remove_xtables()
        } else {
            Ok(())
        };
        let script = format!(
            "table inet {t} {{}}\ndelete table inet {t}\n",
            t = self.table
        );
        let nft = self.ns.run("nft", &["-f", "-"], &script).map(drop);
        xt.and(nft)
    }

    /// Deletes every jump to our two xtables chains and the chains themselves, found in
    /// `iptables-nft-save` (so leftovers and duplicates go too); then the `security` table if we
    /// created it and it is empty now.
    fn remove_xtables(&self) -> Result<()> {
        let exists = self
            .ns
            .run("nft", &["list", "table", "ip", "security"], "")
            .is_ok();
        if !exists {
            return Ok(());
        }
        let saved = self.ns.run("iptables-nft-save", &["-t", "security"], "")?;
        let ours = |chain: &str| chain == self.out_chain || chain == self.in_chain;
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
        for chain in [&self.out_chain, &self.in_chain] {
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
        self.tidy_security()
    }

    /// Deletes the parts of `ip security` that iptables-nft created for us and that are empty
    /// now: the whole table if it did not exist before, else the built-in chains that did not.
    /// (Someone adding a rule to one of them between the check and the delete would lose it;
    /// nobody else uses a table or chain that did not exist before the gate.)
    fn tidy_security(&self) -> Result<()> {
        let Ok(table) = self.ns.run("nft", &["list", "table", "ip", "security"], "") else {
            return Ok(());
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
        match &self.security_before {
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
/// the transaction, nothing is committed), else Xtables.
fn probe(ns: &Netns, queue: u16) -> Result<Backend> {
    let script = format!("table inet tardi_probe {{\nchain c {{\nqueue num {queue}\n}}\n}}\n");
    match ns.run("nft", &["-c", "-f", "-"], &script) {
        Ok(_) => Ok(Backend::Native),
        Err(NetfilterError::Command { stderr, .. }) => {
            tracing::debug!(stderr = %stderr.trim(), "no native nft queue; using iptables-nft");
            Ok(Backend::Xtables)
        }
        Err(e) => Err(e),
    }
}
