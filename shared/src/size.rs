//! Sizes as people type them on command lines: `4096`, `64K`, `1M`, `2G`
//! (binary multiples, either case), overflow-checked. Both tools' flags
//! and the benchmarks read sizes with this one parser.
#![forbid(unsafe_code)]

/// `s` as a number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n = num
        .parse::<u64>()
        .map_err(|e| format!("bad size {s:?}: {e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("bad size {s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_binary_multiples_in_either_case() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
    }

    #[test]
    fn bad_sizes_say_why() {
        for bad in ["", "K", "1.5M", "-1", "12T", "1 M"] {
            assert!(
                parse_size(bad).unwrap_err().starts_with("bad size"),
                "{bad}"
            );
        }
        assert!(
            parse_size("17179869184G")
                .unwrap_err()
                .contains("too large"),
            "an overflow is refused, not wrapped"
        );
    }
}
