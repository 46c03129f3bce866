//! An environment's footprint over time (pure): what its pods request while awake, its awake
//! and asleep stretches, the resource-hours they add up to, and, with the operator's prices
//! (`--price-per-core-hour`, `--price-per-gib-hour`), what that costs and what sleeping saved.
//!
//! The record ([`Footprint`]) changes only when a stretch ends: the environment falls asleep or
//! wakes, its requests change (a new commit), or its refresh time (24 to 48 hours, drawn from
//! its name: [`refresh_after`]) has passed. Everything in between is computed from it and a
//! clock ([`totals`]), so a running environment costs almost no write to keep its footprint
//! current, and the PR comment (which never reads a clock) shows the figures as of the
//! stretch's start.

use chrono::{DateTime, TimeDelta, Utc};

use super::crd::Footprint;

/// A stretch is closed and a new one begun at least this often (plus a spread of up to as
/// much again, [`refresh_after`]), so that the record and the comment are never far behind.
pub const REFRESH: TimeDelta = TimeDelta::hours(24);

/// When the record of environment `name` (`namespace/name`) is refreshed with nothing having
/// changed: [`REFRESH`] and a part of it again that the name picks (FNV-1a, the same in every
/// replica and release), so that environments created together, or all of them after an
/// upgrade, do not refresh (and edit their comments) at once.
pub fn refresh_after(name: &str) -> TimeDelta {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    let spread = hash % REFRESH.num_seconds().unsigned_abs();
    REFRESH + TimeDelta::seconds(i64::try_from(spread).unwrap_or(0))
}

const GIB: f64 = (1u64 << 30) as f64;

/// What an environment's pods request while awake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_millicores: u64,
    pub memory_bytes: u64,
}

/// The operator's prices, for cost estimates.
#[derive(Clone, Debug, PartialEq)]
pub struct Prices {
    pub per_core_hour: f64,
    pub per_gib_hour: f64,
    /// Written before the amount, e.g. `$` or `EUR `.
    pub currency: String,
}

impl Prices {
    /// The price of `core_hours` and `gib_hours`.
    pub fn cost(&self, core_hours: f64, gib_hours: f64) -> f64 {
        core_hours * self.per_core_hour + gib_hours * self.per_gib_hour
    }

    fn say(&self, amount: f64) -> String {
        format!("≈ {}{amount:.2}", self.currency)
    }
}

/// The totals up to a moment: the closed stretches and the current one until then.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub awake_seconds: u64,
    pub asleep_seconds: u64,
    pub core_hours: f64,
    pub gib_hours: f64,
    pub saved_core_hours: f64,
    pub saved_gib_hours: f64,
}

/// The record after a reconcile at `now` that found `requests` and the environment `asleep`
/// or not: the same record while nothing changed (and less than `refresh` passed), else the
/// current stretch closed into the totals and a new one begun at `now`.
pub fn account(
    previous: Option<&Footprint>,
    requests: Requests,
    asleep: bool,
    now: DateTime<Utc>,
    refresh: TimeDelta,
) -> Footprint {
    let Some(previous) = previous else {
        return Footprint {
            cpu_millicores: requests.cpu_millicores,
            memory_bytes: requests.memory_bytes,
            asleep,
            since: now,
            ..Default::default()
        };
    };
    let changed = previous.asleep != asleep
        || previous.cpu_millicores != requests.cpu_millicores
        || previous.memory_bytes != requests.memory_bytes;
    if !changed && now.signed_duration_since(previous.since) < refresh {
        return previous.clone();
    }
    let totals = totals(previous, now);
    Footprint {
        cpu_millicores: requests.cpu_millicores,
        memory_bytes: requests.memory_bytes,
        asleep,
        since: now,
        awake_seconds: totals.awake_seconds,
        asleep_seconds: totals.asleep_seconds,
        core_hours: totals.core_hours,
        gib_hours: totals.gib_hours,
        saved_core_hours: totals.saved_core_hours,
        saved_gib_hours: totals.saved_gib_hours,
    }
}

/// The totals of `footprint` at `at`: its closed stretches and the current one until `at`.
pub fn totals(footprint: &Footprint, at: DateTime<Utc>) -> Totals {
    let seconds =
        u64::try_from(at.signed_duration_since(footprint.since).num_seconds()).unwrap_or(0);
    let hours = seconds as f64 / 3600.0;
    let cores = footprint.cpu_millicores as f64 / 1000.0;
    let gib = footprint.memory_bytes as f64 / GIB;
    let mut totals = Totals {
        awake_seconds: footprint.awake_seconds,
        asleep_seconds: footprint.asleep_seconds,
        core_hours: footprint.core_hours,
        gib_hours: footprint.gib_hours,
        saved_core_hours: footprint.saved_core_hours,
        saved_gib_hours: footprint.saved_gib_hours,
    };
    if footprint.asleep {
        totals.asleep_seconds = totals.asleep_seconds.saturating_add(seconds);
        totals.saved_core_hours += cores * hours;
        totals.saved_gib_hours += gib * hours;
    } else {
        totals.awake_seconds = totals.awake_seconds.saturating_add(seconds);
        totals.core_hours += cores * hours;
        totals.gib_hours += gib * hours;
    }
    totals
}

/// The footprint as one line for people (the PR comment), as of `footprint.since`.
pub fn describe(footprint: &Footprint, prices: Option<&Prices>) -> String {
    let cores = footprint.cpu_millicores as f64 / 1000.0;
    let gib = footprint.memory_bytes as f64 / GIB;
    let mut parts = vec![format!(
        "{} and {} requested while awake",
        say_cores(footprint.cpu_millicores),
        say_bytes(footprint.memory_bytes)
    )];
    if let Some(prices) = prices {
        parts[0].push_str(&format!(
            ", {} an hour",
            prices.say(prices.cost(cores, gib))
        ));
    }
    let awake = say_duration(footprint.awake_seconds);
    parts.push(match prices {
        Some(prices) => format!(
            "awake {awake}, {} so far",
            prices.say(prices.cost(footprint.core_hours, footprint.gib_hours))
        ),
        None => format!(
            "awake {awake} ({:.1} core-hours, {:.1} GiB-hours)",
            footprint.core_hours, footprint.gib_hours
        ),
    });
    if footprint.asleep_seconds > 0 || footprint.asleep {
        let asleep = say_duration(footprint.asleep_seconds);
        parts.push(match prices {
            Some(prices) => format!(
                "asleep {asleep}, saved {}",
                prices.say(prices.cost(footprint.saved_core_hours, footprint.saved_gib_hours))
            ),
            None => format!(
                "asleep {asleep}, saved {:.1} core-hours and {:.1} GiB-hours",
                footprint.saved_core_hours, footprint.saved_gib_hours
            ),
        });
    }
    format!(
        "**Footprint** (as of {}): {}",
        footprint.since.format("%Y-%m-%d %H:%M UTC"),
        parts.join(" · ")
    )
}

/// `1500` millicores as `1.5 cores`.
pub fn say_cores(millicores: u64) -> String {
    let cores = trimmed(millicores as f64 / 1000.0, 2);
    let unit = if millicores == 1000 { "core" } else { "cores" };
    format!("{cores} {unit}")
}

/// Bytes as GiB from 1 GiB up, else MiB.
pub fn say_bytes(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", trimmed(bytes as f64 / GIB, 1))
    } else {
        format!("{} MiB", trimmed(bytes as f64 / (1u64 << 20) as f64, 0))
    }
}

/// `number` with at most `decimals` decimals and no trailing zeros.
fn trimmed(number: f64, decimals: usize) -> String {
    let text = format!("{number:.decimals$}");
    match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => text,
    }
}

/// Seconds as `2 d 3 h`, `5 h 10 min` or `12 min`.
pub fn say_duration(seconds: u64) -> String {
    let (days, hours, minutes) = (
        seconds / 86_400,
        seconds % 86_400 / 3600,
        seconds % 3600 / 60,
    );
    match (days, hours) {
        (0, 0) => format!("{minutes} min"),
        (0, _) => format!("{hours} h {minutes} min"),
        _ => format!("{days} d {hours} h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    const WEB: Requests = Requests {
        cpu_millicores: 1500,
        memory_bytes: 3 << 30,
    };

    #[test]
    fn nothing_changes_the_record_within_a_stretch_of_less_than_a_day() {
        let start = account(None, WEB, false, at("2026-11-26T10:00:00Z"), REFRESH);
        let later = account(
            Some(&start),
            WEB,
            false,
            at("2026-11-27T09:59:00Z"),
            REFRESH,
        );
        assert_eq!(later, start, "no write while nothing changed");
        let next_day = account(
            Some(&start),
            WEB,
            false,
            at("2026-11-27T10:00:00Z"),
            REFRESH,
        );
        assert_eq!(next_day.since, at("2026-11-27T10:00:00Z"));
        assert_eq!(next_day.awake_seconds, 86_400);
        assert!(
            (next_day.core_hours - 36.0).abs() < 1e-9,
            "1.5 cores for 24 h"
        );
        assert!((next_day.gib_hours - 72.0).abs() < 1e-9);
    }

    #[test]
    fn sleeping_saves_what_the_environment_requests_awake() {
        let awake = account(None, WEB, false, at("2026-11-26T00:00:00Z"), REFRESH);
        let asleep = account(Some(&awake), WEB, true, at("2026-11-26T10:00:00Z"), REFRESH);
        assert!(asleep.asleep);
        assert_eq!(asleep.awake_seconds, 36_000);
        let woken = account(
            Some(&asleep),
            WEB,
            false,
            at("2026-11-26T16:00:00Z"),
            REFRESH,
        );
        assert_eq!(woken.asleep_seconds, 6 * 3600);
        assert!(
            (woken.saved_core_hours - 9.0).abs() < 1e-9,
            "1.5 cores for 6 h"
        );
        assert!((woken.core_hours - 15.0).abs() < 1e-9, "1.5 cores for 10 h");
        let now = totals(&woken, at("2026-11-26T18:00:00Z"));
        assert_eq!(now.awake_seconds, 12 * 3600);
        assert!((now.core_hours - 18.0).abs() < 1e-9);
    }

    #[test]
    fn new_requests_end_the_stretch_at_the_old_rate() {
        let small = Requests {
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
        };
        let first = account(None, small, false, at("2026-11-26T00:00:00Z"), REFRESH);
        let bigger = account(
            Some(&first),
            WEB,
            false,
            at("2026-11-26T02:00:00Z"),
            REFRESH,
        );
        assert!((bigger.core_hours - 1.0).abs() < 1e-9, "0.5 cores for 2 h");
        assert_eq!(bigger.cpu_millicores, 1500);
    }

    #[test]
    fn the_comment_line_says_requests_time_and_cost() {
        let prices = Prices {
            per_core_hour: 0.04,
            per_gib_hour: 0.004,
            currency: "$".into(),
        };
        let mut footprint = account(None, WEB, false, at("2026-11-24T00:00:00Z"), REFRESH);
        footprint = account(
            Some(&footprint),
            WEB,
            true,
            at("2026-11-26T03:00:00Z"),
            REFRESH,
        );
        footprint = account(
            Some(&footprint),
            WEB,
            false,
            at("2026-11-27T10:00:00Z"),
            REFRESH,
        );
        let line = describe(&footprint, Some(&prices));
        assert_eq!(
            line,
            "**Footprint** (as of 2026-11-27 10:00 UTC): 1.5 cores and 3 GiB requested while awake, ≈ $0.07 an hour · awake 2 d 3 h, ≈ $3.67 so far · asleep 1 d 7 h, saved ≈ $2.23"
        );
        let plain = describe(&footprint, None);
        assert!(
            plain.contains("awake 2 d 3 h (76.5 core-hours, 153.0 GiB-hours)"),
            "{plain}"
        );
    }

    #[test]
    fn the_refresh_is_spread_over_a_day_by_name() {
        let after: Vec<TimeDelta> = (0..200)
            .map(|n| refresh_after(&format!("previews/web-pr-{n}")))
            .collect();
        assert!(after.iter().all(|a| *a >= REFRESH && *a < REFRESH * 2));
        let first_half = after.iter().filter(|a| **a < REFRESH + REFRESH / 2).count();
        assert!(
            (60..=140).contains(&first_half),
            "{first_half} of 200 in the first half"
        );
        assert_eq!(
            refresh_after("previews/web-pr-1"),
            refresh_after("previews/web-pr-1")
        );
    }

    #[test]
    fn small_figures_read_well() {
        assert_eq!(say_cores(250), "0.25 cores");
        assert_eq!(say_cores(1000), "1 core");
        assert_eq!(say_bytes(640 << 20), "640 MiB");
        assert_eq!(say_bytes(3 << 29), "1.5 GiB");
        assert_eq!(say_duration(720), "12 min");
        assert_eq!(say_duration(3600 * 5 + 600), "5 h 10 min");
    }
}
