//! Kubernetes resource quantities (`250m`, `0.5`, `128Mi`, `1G`, `1e3`) as numbers: CPU in
//! millicores, memory in bytes, rounded up as Kubernetes rounds them. The forms the API server
//! accepts: a sign, a decimal number, then a decimal exponent (`e3`, `E-2`) or a suffix (`n`,
//! `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`, `Ki` … `Ei`); anything else is `None`. Checked
//! arithmetic throughout: the text comes from templates.

/// A quantity's value times 1000 (millicores for CPU), rounded up.
pub fn millis(text: &str) -> Option<u64> {
    scaled(text, 3)
}

/// A quantity's value (bytes for memory), rounded up.
pub fn units(text: &str) -> Option<u64> {
    scaled(text, 0)
}

/// The quantity `text` times `10^factor_exponent`, rounded up to a whole number; negative
/// quantities are `None`.
fn scaled(text: &str, factor_exponent: i32) -> Option<u64> {
    let text = text.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (power_of_ten, binary_shift) = suffix_scale(suffix)?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significand: u128 = digits.parse().ok()?;
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    let exponent = power_of_ten + factor_exponent - fraction_digits;
    let mut numerator = significand.checked_mul(1u128.checked_shl(binary_shift)?)?;
    let mut denominator: u128 = 1;
    let ten_to = |n: i32| 10u128.checked_pow(u32::try_from(n).ok()?);
    if exponent >= 0 {
        numerator = numerator.checked_mul(ten_to(exponent)?)?;
    } else {
        denominator = ten_to(-exponent)?;
    }
    u64::try_from(numerator.div_ceil(denominator)).ok()
}

/// `(power of ten, power of two)` a suffix multiplies by: `e3` is `(3, 0)`, `Ki` is `(0, 10)`.
fn suffix_scale(suffix: &str) -> Option<(i32, u32)> {
    if let Some(exponent) = suffix.strip_prefix(['e', 'E'])
        && !exponent.is_empty()
    {
        let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
        if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value: i32 = exponent.parse().ok()?;
        return (-40..=40).contains(&value).then_some((value, 0));
    }
    Some(match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => return None,
    })
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
    fn exponents_and_every_suffix_the_api_server_accepts() {
        assert_eq!(units("1e3"), Some(1000));
        assert_eq!(units("1E9"), Some(1_000_000_000));
        assert_eq!(millis("5e-1"), Some(500));
        assert_eq!(units("+2"), Some(2));
        assert_eq!(units("1Pi"), Some(1 << 50));
        assert_eq!(units("2E"), Some(2_000_000_000_000_000_000));
        assert_eq!(millis("500000000n"), Some(500));
        assert_eq!(millis("250000u"), Some(250));
        assert_eq!(
            millis("0.0000000001"),
            Some(1),
            "more than 9 decimals, rounded up"
        );
    }

    #[test]
    fn anything_else_is_no_quantity_and_nothing_overflows() {
        for bad in [
            "", "m", "1.2.3", "-1", "1x", "1e", "1e+", "1e9999", "abc", "1.5.Gi", ".",
        ] {
            assert_eq!(units(bad), None, "{bad}");
        }
        assert_eq!(units("18446744073709551615Ti"), None);
        assert_eq!(millis("18446744073709551615"), None);
        assert_eq!(units("999999999999999999999999999999Ei"), None);
        assert_eq!(units("16Ei"), None, "2^64 does not fit");
    }
}
