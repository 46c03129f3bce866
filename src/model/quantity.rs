//! Kubernetes resource quantities (`250m`, `0.5`, `128Mi`, `1G`) as numbers: CPU in
//! millicores, memory in bytes. Only the forms the API server accepts; anything else is `None`
//! (such an object is refused by the API server anyway). Checked arithmetic throughout: the
//! text comes from templates.

/// A quantity's value times 1000 (millicores for CPU), rounded up.
pub fn millis(text: &str) -> Option<u64> {
    scaled(text, 1000)
}

/// A quantity's value (bytes for memory), rounded up.
pub fn units(text: &str) -> Option<u64> {
    scaled(text, 1)
}

/// The quantity `text` times `factor`, rounded up to a whole number.
fn scaled(text: &str, factor: u64) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    // (multiplier, divisor) of the suffix.
    let (multiplier, divisor): (u64, u64) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.len() > 9 {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let fraction_scale = 10u64.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let fraction: u64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    // value = (whole + fraction / fraction_scale) * multiplier / divisor * factor
    let numerator = whole
        .checked_mul(fraction_scale)?
        .checked_add(fraction)?
        .checked_mul(multiplier)?
        .checked_mul(factor)?;
    let denominator = fraction_scale.checked_mul(divisor)?;
    Some(numerator.div_ceil(denominator))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_reads_as_millicores() {
        assert_eq!(millis("250m"), Some(250));
        assert_eq!(millis("0.5"), Some(500));
        assert_eq!(millis("2"), Some(2000));
        assert_eq!(millis(".1"), Some(100));
        assert_eq!(millis("1.5"), Some(1500));
        assert_eq!(millis("0.0001"), Some(1), "rounded up, as Kubernetes does");
    }

    #[test]
    fn memory_reads_as_bytes() {
        assert_eq!(units("128Mi"), Some(128 << 20));
        assert_eq!(units("1Gi"), Some(1 << 30));
        assert_eq!(units("1.5Gi"), Some(3 << 29));
        assert_eq!(units("500M"), Some(500_000_000));
        assert_eq!(units("1000"), Some(1000));
        assert_eq!(units("64k"), Some(64_000));
    }

    #[test]
    fn anything_else_is_no_quantity_and_nothing_overflows() {
        for bad in [
            "",
            "m",
            "1.2.3",
            "-1",
            "1x",
            "1e3",
            "99999999999999999999",
            "1.0000000001",
            "abc",
        ] {
            assert_eq!(units(bad), None, "{bad}");
        }
        assert_eq!(units("18446744073709551615Ti"), None);
        assert_eq!(millis("18446744073709551615"), None);
    }
}
