//! Output commit: a sandbox's network output is held until the checkpoint of the epoch that
//! produced it is replicated ("decided"), then released in order (Tardigrade, NSDI'15).
//!
//! # Model
//! The instance creates one [`Gate`] per sandbox, in the network namespace that holds the host
//! side of the sandbox's veth pair. It calls [`Gate::mark`]`(e)` inside the checkpoint pause of
//! epoch `e` and [`Gate::release`]`(d)` once epochs up to `d` are decided. The gate knows epochs
//! only as numbers: it never looks at checkpoints, memory or the service. A reader thread takes
//! each queued packet's id from the kernel and tags it with the epoch in progress (the last
//! mark + 1); a release accepts every packet tagged `<= d` with one batch verdict.
//!
//! ```no_run
//! # fn main() -> Result<(), tardi_netfilter::NetfilterError> {
//! use std::time::Duration;
//! use tardi_netfilter::{Gate, GateConfig, Mode};
//!
//! // On a thread in the namespace of `td1h` (the host side of the sandbox's veth).
//! tardi_netfilter::announce::enable_forwarding()?;
//! let gate = Gate::new(GateConfig::new("td1h", 2))?; // queues 2 (output) and 3 (input)
//! for epoch in 1.. {
//!     gate.wait_output(Duration::from_millis(5)); // adaptive: end the epoch early on output
//!     // ... stop the service ...
//!     gate.mark(epoch);
//!     // ... resume; once the checkpoint of `epoch` is replicated:
//!     gate.release(epoch)?;
//! #   break;
//! }
//! gate.set_mode(Mode::Drop)?; // no longer the primary
//! # Ok(())
//! # }
//! ```
//!
//! A restore holds the sandbox's *input* meanwhile ([`Gate::hold_input`]); a failover moves the
//! service address ([`announce::ServiceAddress`]).
//!
//! # What the crate owns, and must not touch
//! The nftables table `inet tardi` (shared by the gates of a namespace; it goes with the last
//! one). Per gate: the chains `out_<host_if>` / `in_<host_if>`, the counter
//! `dropped_<host_if>` and the jumps to them in `inet tardi`; the iptables-nft chains
//! `TARDI-OUT-<host_if>` / `TARDI-IN-<host_if>` of table `ip security` with the jumps to them;
//! two NFQUEUE numbers (per namespace). Dropping the gate removes exactly these (and what
//! iptables-nft created in `ip security` for the gates, once empty). No other rule, table or
//! chain of the system is changed. [`announce::ServiceAddress`] owns one proxy ARP entry and the
//! interface's `proxy_delay` while it lives.
//!
//! # Kernel facts relied on (measured on the development machine, Linux 6.18)
//! - `CONFIG_NFT_QUEUE` is not set there: nftables' own `queue` statement fails. The xtables
//!   `NFQUEUE` target works through `iptables-nft` (`CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y`,
//!   `CONFIG_NFT_COMPAT=y`). The gate probes (`nft -c` with a `queue` rule) and uses the native
//!   statement where it exists, else iptables-nft ([`Backend`]); see `rules.rs`.
//! - `CONFIG_NETFILTER_NETLINK_QUEUE=y`. One batch verdict (`NFQNL_MSG_VERDICT_BATCH`: every
//!   queued packet with id `<= N`) costs ~2 µs per packet and keeps order.
//! - Where the queue sits: holding packets on the OUTPUT hook inside the sender's namespace
//!   stalls the sender (TCP small queues: 0.3 MB/s with a 20 ms hold). Holding them after they
//!   leave the sandbox's namespace (FORWARD, `iifname <host_if>`, in the host-side namespace)
//!   does not (66 MB/s TCP, 116–130k UDP packets/s). Packets from the sandbox to the machine
//!   itself are held on INPUT, packets to the sandbox (input hold) on FORWARD and OUTPUT.
//! - Unregistering any netfilter hook (deleting any base chain) in a namespace drops every
//!   packet queued in any NFQUEUE of that namespace (`nf_queue_nf_hook_drop`, Linux >= 4.13).
//!   So the gates of a namespace share their base chains, and a gate's removal touches rules and
//!   regular chains only; someone else's rule reload can still lose (never leak) held output.
//! - Without `NFQA_CFG_F_FAIL_OPEN` and without `bypass`, a packet that cannot be queued (queue
//!   full, socket buffer full, no socket bound) is dropped, never accepted; closing the socket
//!   drops what is held. Held output can be lost, never leaked. See `nfq.rs`.
//! - Waking a thread on the other CPU costs ~69 µs: [`Gate::mark`] is one atomic operation,
//!   [`Gate::release`] sends the verdict on the caller's thread, and the reader wakes a
//!   [`Gate::wait_output`] caller only when one is waiting.

mod cmd;
mod error;
mod gate;
mod nfq;
mod rules;

pub mod announce;
pub mod probe;

pub use error::{NetfilterError, Result};
pub use gate::{Gate, GateConfig, GateStats, Mode};
pub use rules::Backend;
