//! Which push sources run, given the runtime plegd connected to: a pure decision, made once at
//! start from what `--sources` asked (or its default), the runtime's name and version, and
//! `--allow-shared-cri-events`.
//!
//! The rule is a good neighbour's: plegd takes no events from other agents on the node.
//! - On containerd (every version) `cri-events` is off by default: containerd's own event
//!   stream (`containerd`) is broadcast to every subscriber and carries more (exit status, OOM,
//!   task start), so CRI `GetContainerEvents` adds nothing plegd needs.
//! - containerd before 2.0 serves `GetContainerEvents` from one channel shared by all its
//!   callers: each subscriber gets only some of the events (containerd issue #7318, fixed by
//!   #9661 in 2.0; measured on 1.7.24: another subscriber got 19 of its 40 events beside a
//!   plegd subscribed to it). Asking for `cri-events` there is refused, unless
//!   `--allow-shared-cri-events` says to take that cost.
//! - A runtime that is not containerd (CRI-O) has no containerd stream: `cri-events` stays on
//!   by default, `containerd` is off by default.
//! - A runtime that did not say what it is (Version failed) is treated as a containerd of
//!   unknown version: `cri-events` off by default, refused when asked for without the override.

use std::{collections::BTreeMap, fmt};

use crate::pleg::Source;

/// The runtime, as far as the choice of sources goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeInfo {
    /// containerd; `version` is what it reported (e.g. `v1.7.24`, `2.1.9+unknown`).
    Containerd { version: String },
    /// A CRI runtime other than containerd (CRI-O): no containerd event stream.
    Other { name: String, version: String },
    /// The runtime did not answer Version: why.
    Unknown { why: String },
}

impl RuntimeInfo {
    /// From the name and version a runtime's Version call gave.
    pub fn from_version(name: &str, version: &str) -> Self {
        if name.eq_ignore_ascii_case("containerd") {
            Self::Containerd {
                version: version.to_owned(),
            }
        } else {
            Self::Other {
                name: name.to_owned(),
                version: version.to_owned(),
            }
        }
    }
}

impl fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Containerd { version } => write!(f, "containerd {version}"),
            Self::Other { name, version } => write!(f, "{name} {version}"),
            Self::Unknown { .. } => f.write_str("an unknown runtime"),
        }
    }
}

/// `MAJOR.MINOR` of a containerd version string: `v1.7.24`, `1.7.24~ds1`, `2.1.9+unknown`,
/// `v2.0.0-rc.1`. `None` if it does not start with two numbers.
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let number = |part: Option<&str>| -> Option<u32> {
        let digits: String = part?.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((number(parts.next())?, number(parts.next())?))
}

/// What was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The push sources `--sources` named (never [`Source::Relist`]); empty in polling
    /// mode.
    pub sources: Vec<Source>,
    /// Whether `--sources` (flag, variable or file) gave them, rather than the default.
    pub given: bool,
    /// `--allow-shared-cri-events`.
    pub allow_shared_cri_events: bool,
}

/// The push sources that run, and for each push source why it runs or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub on: Vec<Source>,
    /// One line per push source ([`Source::PUSH`]), on or off.
    pub why: BTreeMap<Source, String>,
}

impl Plan {
    /// Whether `source` runs.
    pub fn runs(&self, source: Source) -> bool {
        self.on.contains(&source)
    }
}

/// `cri-events` asked for where it would take events from other subscribers.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the cri-events source is refused on containerd {version}: containerd before 2.0 serves \
         CRI GetContainerEvents from one channel shared by every subscriber, so each takes \
         events from the others (kubelet's evented PLEG, Falco, ...; containerd issue #7318, \
         fixed by #9661 in 2.0). containerd's own event stream (source `containerd`) brings \
         plegd the same changes without taking any: remove cri-events from --sources, or set \
         --allow-shared-cri-events to subscribe anyway"
    )]
    SharedCriEvents { version: String },
    #[error(
        "the cri-events source is refused: the runtime did not say what it is ({why}), and on \
         containerd before 2.0 CRI GetContainerEvents is one channel shared by every \
         subscriber, so each takes events from the others (containerd issue #7318): remove \
         cri-events from --sources, or set --allow-shared-cri-events to subscribe anyway"
    )]
    UnknownRuntime { why: String },
}

/// Whether this runtime gives every `GetContainerEvents` subscriber a stream of its own.
#[derive(Clone, Copy)]
enum CriEventsFit {
    /// containerd >= 2.0, CRI-O.
    OwnStream,
    /// containerd < 2.0 (1.7: one shared channel; 1.6: not implemented).
    Shared,
    /// Cannot tell.
    Unknown,
}

/// Chooses the push sources for `runtime` from `request`; see the module's rules.
pub fn choose(runtime: &RuntimeInfo, request: &Request) -> Result<Plan, Refused> {
    let choosing = Choosing::new(runtime, request);
    let mut plan = Plan {
        on: Vec::new(),
        why: BTreeMap::new(),
    };
    for (source, (on, why)) in [
        (Source::Ebpf, choosing.ebpf()),
        (Source::Containerd, choosing.containerd()),
        (Source::CriEvents, choosing.cri_events()?),
    ] {
        if on {
            plan.on.push(source);
        }
        plan.why.insert(source, why);
    }
    Ok(plan)
}

/// What every source's choice depends on.
struct Choosing<'a> {
    runtime: &'a RuntimeInfo,
    request: &'a Request,
    fit: CriEventsFit,
    /// containerd, or a runtime that may be one: its own event stream is the default.
    containerd_like: bool,
    /// Why a source asked for runs.
    by: &'static str,
    /// Why a source not asked for does not.
    not_asked: &'static str,
}

/// Whether a source runs, and why.
type Choice = (bool, String);

const SHARED_NOTE: &str = "containerd before 2.0 shares one GetContainerEvents channel among \
                           all subscribers (containerd #7318)";

impl<'a> Choosing<'a> {
    fn new(runtime: &'a RuntimeInfo, request: &'a Request) -> Self {
        let fit = match runtime {
            RuntimeInfo::Containerd { version } => match major_minor(version) {
                Some((major, _)) if major >= 2 => CriEventsFit::OwnStream,
                Some(_) => CriEventsFit::Shared,
                None => CriEventsFit::Unknown,
            },
            RuntimeInfo::Other { .. } => CriEventsFit::OwnStream,
            RuntimeInfo::Unknown { .. } => CriEventsFit::Unknown,
        };
        Self {
            runtime,
            request,
            fit,
            containerd_like: !matches!(runtime, RuntimeInfo::Other { .. }),
            by: if request.given {
                "asked for by --sources"
            } else {
                "on by default"
            },
            not_asked: if request.sources.is_empty() {
                "off: --mode polling, or --sources relist"
            } else {
                "off: not in --sources"
            },
        }
    }

    fn asked(&self, source: Source) -> bool {
        self.request.sources.contains(&source)
    }

    fn ebpf(&self) -> Choice {
        let on = self.asked(Source::Ebpf);
        (on, if on { self.by } else { self.not_asked }.to_owned())
    }

    /// containerd's stream: its default follows the runtime; asked for explicitly, it runs
    /// (and reports unsupported where there is none).
    fn containerd(&self) -> Choice {
        let (by, runtime) = (self.by, self.runtime);
        let on = self.asked(Source::Containerd) && (self.request.given || self.containerd_like);
        let why = match (on, runtime) {
            (true, RuntimeInfo::Containerd { .. }) => format!(
                "{by}: containerd's event stream, broadcast to every subscriber, confirms \
                 starts and exits with their status"
            ),
            (true, _) => by.to_owned(),
            (false, RuntimeInfo::Other { .. }) if self.asked(Source::Containerd) => {
                format!("off by default: {runtime} has no containerd event stream")
            }
            (false, _) => self.not_asked.to_owned(),
        };
        (on, why)
    }

    /// CRI's event stream: only where it takes nothing from other subscribers, unless allowed.
    fn cri_events(&self) -> Result<Choice, Refused> {
        let (by, runtime) = (self.by, self.runtime);
        let given = self.request.given;
        Ok(match (self.asked(Source::CriEvents), given, self.fit) {
            (false, _, _) => (false, self.not_asked.to_owned()),
            // The default on containerd: its own stream serves.
            (true, false, _) if self.containerd_like => (
                false,
                format!(
                    "off by default on {runtime}: {}; --sources with cri-events turns it on",
                    self.default_off_because()
                ),
            ),
            (true, false, _) => (
                true,
                format!("on by default: {runtime} has no containerd event stream"),
            ),
            (true, true, CriEventsFit::OwnStream) => (true, self.own_stream()),
            (true, true, CriEventsFit::Shared | CriEventsFit::Unknown)
                if self.request.allow_shared_cri_events =>
            {
                (
                    true,
                    format!(
                        "{by} with --allow-shared-cri-events on {runtime}: takes events from \
                         other GetContainerEvents subscribers ({SHARED_NOTE})"
                    ),
                )
            }
            (true, true, CriEventsFit::Shared) => {
                return Err(Refused::SharedCriEvents {
                    version: match runtime {
                        RuntimeInfo::Containerd { version } => version.clone(),
                        _ => String::new(),
                    },
                });
            }
            (true, true, CriEventsFit::Unknown) => {
                return Err(match runtime {
                    RuntimeInfo::Containerd { version } => Refused::UnknownRuntime {
                        why: format!("containerd version {version:?} does not parse"),
                    },
                    _ => Refused::UnknownRuntime {
                        why: unknown_why(runtime),
                    },
                });
            }
        })
    }

    /// Why CRI's events are off by default on a containerd-like runtime.
    fn default_off_because(&self) -> String {
        match self.fit {
            CriEventsFit::OwnStream => "containerd's own event stream serves".to_owned(),
            CriEventsFit::Shared => {
                format!("containerd's own event stream serves, and {SHARED_NOTE}")
            }
            CriEventsFit::Unknown => format!(
                "the runtime's version is unknown ({}), and {SHARED_NOTE}",
                unknown_why(self.runtime)
            ),
        }
    }

    /// Why CRI's events run on a runtime that gives each subscriber its own stream.
    fn own_stream(&self) -> String {
        let (by, runtime) = (self.by, self.runtime);
        if self.containerd_like {
            format!(
                "{by}: {runtime} gives each GetContainerEvents subscriber its own stream; its \
                 publisher waits on a full one (100 events), so a plegd that stops reading \
                 (frozen, starved) holds up containerd's container calls"
            )
        } else {
            format!("{by}: {runtime} gives each GetContainerEvents subscriber its own stream")
        }
    }
}

fn unknown_why(runtime: &RuntimeInfo) -> String {
    match runtime {
        RuntimeInfo::Unknown { why } => why.clone(),
        RuntimeInfo::Containerd { version } => format!("containerd version {version:?}"),
        RuntimeInfo::Other { .. } => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pleg::Source::{Containerd as C, CriEvents as E, Ebpf as B};

    fn containerd(version: &str) -> RuntimeInfo {
        RuntimeInfo::Containerd {
            version: version.to_owned(),
        }
    }

    fn crio() -> RuntimeInfo {
        RuntimeInfo::from_version("cri-o", "1.30.0")
    }

    fn unknown() -> RuntimeInfo {
        RuntimeInfo::Unknown {
            why: "Version timed out".to_owned(),
        }
    }

    /// The default `--sources`, and an explicit one.
    const DEFAULT: Option<&[Source]> = None;

    /// What was chosen: the sources on, or which refusal.
    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        On(&'static [Source]),
        Shared,
        Unknown,
    }

    #[test]
    fn the_sources_fit_the_runtime() {
        use Outcome::{On, Shared, Unknown};
        let all: &[Source] = &[B, C, E];
        // (runtime, --sources (None: default), --allow-shared-cri-events, outcome)
        let table: &[(RuntimeInfo, Option<&[Source]>, bool, Outcome)] = &[
            // containerd, every version: cri-events off by default, its own stream serves.
            (containerd("1.6.20~ds1"), DEFAULT, false, On(&[B, C])),
            (containerd("v1.7.24"), DEFAULT, false, On(&[B, C])),
            (containerd("2.1.9+unknown"), DEFAULT, false, On(&[B, C])),
            (containerd("v2.0.0-rc.1"), DEFAULT, true, On(&[B, C])),
            // Asked for on containerd < 2.0: refused, unless the override says so.
            (containerd("v1.7.24"), Some(all), false, Shared),
            (containerd("1.7.24~ds1"), Some(&[E]), false, Shared),
            (containerd("1.6.20"), Some(&[C, E]), false, Shared),
            (containerd("v1.7.24"), Some(all), true, On(&[B, C, E])),
            (containerd("v1.7.24"), Some(&[E]), true, On(&[E])),
            // containerd 2.x: each subscriber has its own queue.
            (containerd("v2.1.9"), Some(all), false, On(&[B, C, E])),
            (containerd("2.0.0"), Some(&[E]), false, On(&[E])),
            (containerd("10.0.1"), Some(&[E]), false, On(&[E])),
            // Asked without cri-events: as asked.
            (containerd("v1.7.24"), Some(&[B, C]), false, On(&[B, C])),
            (containerd("v1.7.24"), Some(&[]), false, On(&[])),
            // CRI-O: no containerd stream; cri-events on by default.
            (crio(), DEFAULT, false, On(&[B, E])),
            (crio(), Some(all), false, On(&[B, C, E])),
            (crio(), Some(&[E]), false, On(&[E])),
            (crio(), Some(&[B]), false, On(&[B])),
            // A runtime that did not say what it is: like a containerd of unknown version.
            (unknown(), DEFAULT, false, On(&[B, C])),
            (unknown(), Some(all), false, Unknown),
            (unknown(), Some(all), true, On(&[B, C, E])),
            (containerd("devel"), DEFAULT, false, On(&[B, C])),
            (containerd("devel"), Some(&[E]), false, Unknown),
            (containerd("devel"), Some(&[E]), true, On(&[E])),
        ];
        for (runtime, sources, allow, expected) in table {
            let request = Request {
                sources: sources.unwrap_or(all).to_vec(),
                given: sources.is_some(),
                allow_shared_cri_events: *allow,
            };
            let outcome = match choose(runtime, &request) {
                Ok(plan) => {
                    let On(want) = expected else {
                        panic!("{runtime:?} {request:?}: expected {expected:?}, got {plan:?}");
                    };
                    assert_eq!(plan.on, *want, "{runtime:?} {request:?}: {plan:?}");
                    // Every push source is said, on or off.
                    assert_eq!(
                        plan.why.keys().copied().collect::<Vec<_>>(),
                        Source::PUSH,
                        "{runtime:?} {request:?}"
                    );
                    continue;
                }
                Err(Refused::SharedCriEvents { .. }) => Shared,
                Err(Refused::UnknownRuntime { .. }) => Unknown,
            };
            assert_eq!(&outcome, expected, "{runtime:?} {request:?}");
        }
    }

    #[test]
    fn the_refusal_names_the_reason_and_the_way_out() {
        let request = Request {
            sources: vec![B, C, E],
            given: true,
            allow_shared_cri_events: false,
        };
        let err = choose(&containerd("v1.7.24"), &request)
            .unwrap_err()
            .to_string();
        for needle in [
            "containerd v1.7.24",
            "one channel shared by every subscriber",
            "takes events from the others",
            "#7318",
            "#9661",
            "--allow-shared-cri-events",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn each_source_says_why_it_runs_or_not() {
        let request = Request {
            sources: vec![B, C, E],
            given: false,
            allow_shared_cri_events: false,
        };
        let plan = choose(&containerd("v1.7.24"), &request).unwrap();
        assert!(plan.why[&E].starts_with("off by default on containerd v1.7.24"));
        assert!(plan.why[&E].contains("#7318"), "{}", plan.why[&E]);
        assert!(
            plan.why[&C].starts_with("on by default"),
            "{}",
            plan.why[&C]
        );
        let plan = choose(&containerd("2.1.9"), &request).unwrap();
        assert!(!plan.why[&E].contains("#7318"), "{}", plan.why[&E]);
        let plan = choose(&crio(), &request).unwrap();
        assert_eq!(
            plan.why[&E],
            "on by default: cri-o 1.30.0 has no containerd event stream"
        );
        assert!(plan.why[&C].contains("no containerd event stream"));
    }

    #[test]
    fn versions_parse_with_and_without_their_decorations() {
        for (text, parsed) in [
            ("v1.7.24", Some((1, 7))),
            ("1.7.24~ds1", Some((1, 7))),
            ("2.1.9+unknown", Some((2, 1))),
            ("v2.0.0-rc.1", Some((2, 0))),
            (" 1.6.20 ", Some((1, 6))),
            ("devel", None),
            ("", None),
            ("2", None),
        ] {
            assert_eq!(major_minor(text), parsed, "{text:?}");
        }
    }
}
