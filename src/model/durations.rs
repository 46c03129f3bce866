//! Durations as people write them in templates, flags and comment commands (`90s`, `10m`,
//! `72h`, `14d`). One parser for all of them, so that `/preview extend 3d`, `--sweep-interval 3d`
//! and `lifecycle.idleTimeout: 3d` mean the same thing; multiplication is checked, because the
//! text comes from pull-request comments and templates.

use std::time::Duration;

use chrono::TimeDelta;

/// Parses `90s`, `10m`, `72h`, `14d` (or a plain number of seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 10m, 72h or 14d"))?;
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use s, m, h or d)"
            ));
        }
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

/// An optional template duration (`lifecycle.idleTimeout` and the like) as a `TimeDelta`;
/// `None` when unset, unparseable, or beyond what `TimeDelta` holds.
pub fn template_duration(text: Option<&str>) -> Option<TimeDelta> {
    text.and_then(|t| parse_duration(t).ok())
        .and_then(|d| TimeDelta::from_std(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("72h"), Ok(Duration::from_secs(259_200)));
        // Would overflow when multiplied out (a hostile `/preview extend`): an error.
        assert!(parse_duration("1000000000000000d").is_err());
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(1_209_600)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("m").is_err());
    }
}
