//! Kubernetes quantities as exact milli-values, with Kubernetes' canonical text form.
//!
//! Values are kept in thousandths (`i128`, so `Ei` of memory fits); anything finer than a milli-unit
//! is rounded up, as the API server does. The text form follows the API server's canonicalisation so
//! that messages print `1500m`, `2`, `4Gi`, `1k` as Koordinator users see them.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// How a quantity is written; sums keep the format of their first operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

#[derive(Clone, Copy, Debug, Eq)]
pub struct Qty {
    milli: i128,
    format: Format,
}

impl PartialEq for Qty {
    fn eq(&self, other: &Self) -> bool {
        self.milli == other.milli
    }
}

impl PartialOrd for Qty {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Qty {
    fn cmp(&self, other: &Self) -> Ordering {
        self.milli.cmp(&other.milli)
    }
}

impl Default for Qty {
    fn default() -> Self {
        Self::ZERO
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    /// Kubernetes' (and Koordinator's) words, without the value: callers name the field.
    Syntax(String),
    /// Kubernetes accepts it, but its value does not fit the 128-bit milli-units arithmetic here.
    #[error("quantity {0:?} is too large: koord-webhook handles quantities up to 10^35")]
    TooLarge(String),
}

const DECIMAL_SUFFIXES: &[(&str, i32)] = &[
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];
const BINARY_SUFFIXES: &[(&str, u32)] = &[
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

impl Qty {
    pub const ZERO: Qty = Qty {
        milli: 0,
        format: Format::DecimalSI,
    };

    pub fn from_milli(milli: i128, format: Format) -> Self {
        Self { milli, format }
    }

    pub fn milli(&self) -> i128 {
        self.milli
    }

    /// The value in whole units, rounded up (as Kubernetes' `Value()`).
    pub fn units_ceil(&self) -> i128 {
        self.milli.div_euclid(1000) + i128::from(self.milli.rem_euclid(1000) != 0)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.milli == 0
    }

    pub fn is_negative(&self) -> bool {
        self.milli < 0
    }

    pub fn is_integer(&self) -> bool {
        self.milli % 1000 == 0
    }

    /// Sum that keeps this quantity's format; saturates instead of overflowing.
    pub fn plus(self, other: Qty) -> Qty {
        Qty {
            milli: self.milli.saturating_add(other.milli),
            format: self.format,
        }
    }

    pub fn minus(self, other: Qty) -> Qty {
        Qty {
            milli: self.milli.saturating_sub(other.milli),
            format: self.format,
        }
    }
}

impl TryFrom<&Quantity> for Qty {
    type Error = QuantityError;
    fn try_from(q: &Quantity) -> Result<Self, Self::Error> {
        q.0.parse()
    }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

impl FromStr for Qty {
    type Err = QuantityError;

    // Runs for every quantity of every pod review: no allocation, no formatting machinery.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || QuantityError::Syntax(text.to_owned());
        let too_large = || QuantityError::TooLarge(text.to_owned());
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (mut mantissa, mut digits, mut frac_len, mut dot) = (0i128, 0usize, 0i32, false);
        let mut number_end = s.len();
        for (i, b) in s.bytes().enumerate() {
            match b {
                b'0'..=b'9' => {
                    mantissa = mantissa
                        .checked_mul(10)
                        .and_then(|m| m.checked_add(i128::from(b - b'0')))
                        .ok_or_else(too_large)?;
                    digits += 1;
                    frac_len += i32::from(dot);
                }
                b'.' if !dot => dot = true,
                b'.' => return Err(err()),
                _ => {
                    number_end = i;
                    break;
                }
            }
        }
        if digits == 0 {
            return Err(err());
        }
        let suffix = &s[number_end..];

        let (format, ten_exp, two_exp) =
            if let Some((_, e)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
                (Format::BinarySI, 0, *e)
            } else if let Some((_, e)) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
                (Format::DecimalSI, *e, 0)
            } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
                let e: i32 = exp.parse().map_err(|_| err())?;
                (Format::DecimalExponent, e, 0)
            } else {
                return Err(err());
            };

        // milli = mantissa * 2^two_exp * 10^(ten_exp - frac_len + 3), rounded up when fractional.
        let scaled = mantissa
            .checked_mul(1i128.checked_shl(two_exp).ok_or_else(too_large)?)
            .ok_or_else(too_large)?;
        let exp10 = ten_exp
            .checked_sub(frac_len)
            .and_then(|e| e.checked_add(3))
            .ok_or_else(too_large)?;
        let milli = if exp10 >= 0 {
            // Zero times any power is zero, however large the exponent.
            if scaled == 0 {
                0
            } else {
                scaled
                    .checked_mul(pow10(exp10 as u32).ok_or_else(too_large)?)
                    .ok_or_else(too_large)?
            }
        } else {
            match pow10(exp10.unsigned_abs()) {
                Some(div) => scaled / div + i128::from(scaled % div != 0),
                // Smaller than any milli-unit: rounds up to one (zero stays zero).
                None => i128::from(scaled != 0),
            }
        };
        Ok(Qty {
            milli: if negative { -milli } else { milli },
            format,
        })
    }
}

/// `v / d` and `v % d` in 64-bit arithmetic when `v` fits (128-bit division is a library call).
fn div_rem(v: u128, d: u64) -> (u128, u128) {
    match u64::try_from(v) {
        Ok(v) => ((v / d).into(), (v % d).into()),
        Err(_) => (v / u128::from(d), v % u128::from(d)),
    }
}

/// The canonical text of a quantity, written backwards into a buffer on the stack.
struct Canonical {
    // u128::MAX has 39 digits, plus a sign and a two-letter suffix.
    buf: [u8; 42],
    start: usize,
}

impl Canonical {
    fn push(&mut self, bytes: &[u8]) {
        self.start -= bytes.len();
        self.buf[self.start..self.start + bytes.len()].copy_from_slice(bytes);
    }

    fn push_digits(&mut self, mut value: u128) {
        loop {
            let (rest, digit) = div_rem(value, 10);
            self.push(&[b'0' + digit as u8]);
            value = rest;
            if value == 0 {
                break;
            }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits, signs and suffixes are written.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl Qty {
    fn canonical(&self) -> Canonical {
        let mut out = Canonical {
            buf: [0; 42],
            start: 42,
        };
        let abs = self.milli.unsigned_abs();
        let (value, suffix) = if abs == 0 {
            (0, "")
        } else if self.format == Format::BinarySI && abs >= 1024 * 1000 && div_rem(abs, 1000).1 == 0
        {
            // Binary form only for whole values of at least 1024 (as the API server canonicalises).
            let mut value = div_rem(abs, 1000).0;
            let mut suffix = "";
            for (s, _) in BINARY_SUFFIXES {
                if !value.is_multiple_of(1024) {
                    break;
                }
                value /= 1024;
                suffix = s;
            }
            (value, suffix)
        } else {
            match div_rem(abs, 1000) {
                (_, rem) if rem != 0 => (abs, "m"),
                (mut value, _) => {
                    let mut suffix = "";
                    for (s, _) in DECIMAL_SUFFIXES.iter().filter(|(_, e)| *e > 0) {
                        let (rest, rem) = div_rem(value, 1000);
                        if rem != 0 {
                            break;
                        }
                        value = rest;
                        suffix = s;
                    }
                    (value, suffix)
                }
            }
        };
        out.push(suffix.as_bytes());
        out.push_digits(value);
        if self.milli < 0 {
            out.push(b"-");
        }
        out
    }

    pub fn to_quantity(self) -> Quantity {
        Quantity(self.canonical().as_str().to_owned())
    }

    /// Appends the canonical text (ASCII, never in need of JSON escaping).
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.canonical().as_bytes());
    }
}

impl fmt::Display for Qty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.canonical().as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Qty {
        s.parse().unwrap()
    }

    #[test]
    fn parses_suffixes_into_milli_values() {
        assert_eq!(q("1").milli(), 1000);
        assert_eq!(q("1500m").milli(), 1500);
        assert_eq!(q("1.5").milli(), 1500);
        assert_eq!(q("2k").milli(), 2_000_000);
        assert_eq!(q("1Ki").milli(), 1_024_000);
        assert_eq!(q("4Gi").milli(), 4 * (1 << 30) * 1000);
        assert_eq!(q("1e3").milli(), 1_000_000);
        assert_eq!(q("-2").milli(), -2000);
        assert_eq!(q("1u").milli(), 1, "sub-milli rounds up");
        assert_eq!(q("0.1m").milli(), 1);
        assert_eq!(q("8Ei").milli(), 8 * (1i128 << 60) * 1000);
        assert_eq!(q("1Ki").format(), Format::BinarySI);
        assert_eq!(q("5.").milli(), 5000);
        assert_eq!(q(".5").milli(), 500);
        assert_eq!(q(" 2 ").milli(), 2000);
        assert_eq!(
            q("1e-50").milli(),
            1,
            "far below a milli-unit still rounds up"
        );
        assert_eq!(q("0e-50").milli(), 0);
        let max = "170141183460469231731687303715884105"; // i128::MAX / 1000, whole units
        assert_eq!(q(max).milli(), 170141183460469231731687303715884105000);
    }

    #[test]
    fn valid_but_too_large_says_so() {
        for big in [
            "1e38",
            "1e2147483647",
            "9999999999999999999999999999999999999999",
            "170141183460469231731687303715884106",
            "1e36",
        ] {
            assert_eq!(
                big.parse::<Qty>(),
                Err(QuantityError::TooLarge(big.to_owned())),
                "{big:?}"
            );
        }
        assert!(matches!(
            "1.2.3".parse::<Qty>(),
            Err(QuantityError::Syntax(_))
        ));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "abc",
            "1.2.3",
            "1Qi",
            ".",
            "--1",
            "1e",
            "m",
            "1e99999999999",
            "1e2147483647",
            "9999999999999999999999999999999999999999",
            "170141183460469231731687303715884106",
        ] {
            assert!(bad.parse::<Qty>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prints_the_canonical_form() {
        assert_eq!(q("1500m").to_string(), "1500m");
        assert_eq!(q("2000m").to_string(), "2");
        assert_eq!(q("1000").to_string(), "1k");
        assert_eq!(q("1500").to_string(), "1500");
        assert_eq!(q("1536Mi").to_string(), "1536Mi");
        assert_eq!(q("1.5Gi").to_string(), "1536Mi");
        assert_eq!(q("0.5Ki").to_string(), "512");
        assert_eq!(q("1048576").to_string(), "1048576");
        assert_eq!(q("4096Mi").to_string(), "4Gi");
        assert_eq!(q("0").to_string(), "0");
        assert_eq!(q("-0").to_string(), "0");
        assert_eq!(q("1e3").to_string(), "1k");
        assert_eq!(q("1.5Ki").to_string(), "1536");
        assert_eq!(q("-4Gi").to_string(), "-4Gi");
        assert_eq!(q("2Ei").to_string(), "2Ei");
        assert_eq!(q("20E").to_string(), "20E");
        assert_eq!(q("100P").to_string(), "100P");
        assert_eq!(q("0.5m").to_string(), "1m");
        assert_eq!(q("1").to_quantity(), Quantity("1".into()));
        let mut out = b"x".to_vec();
        q("-1.5Gi").write_to(&mut out);
        assert_eq!(out, b"x-1536Mi");
        assert_eq!(q("-1500m").to_string(), "-1500m");
        assert_eq!(q("1Ki").plus(q("1Ki")).to_string(), "2Ki");
        assert_eq!(q("1").plus(q("500m")).to_string(), "1500m");
    }

    proptest! {
        #[test]
        fn parse_format_parse_is_stable(milli in -(1i128 << 70)..(1i128 << 70), binary in any::<bool>()) {
            let format = if binary { Format::BinarySI } else { Format::DecimalSI };
            let value = Qty::from_milli(milli, format);
            let text = value.to_string();
            let again: Qty = text.parse().unwrap();
            prop_assert_eq!(again.milli(), milli, "{}", text);
            prop_assert_eq!(again.to_string(), text);
        }

        #[test]
        fn written_quantities_round_trip(units in 0u64..1_000_000, suffix in prop::sample::select(vec!["", "m", "k", "M", "G", "Ki", "Mi", "Gi"])) {
            let text = format!("{units}{suffix}");
            let parsed: Qty = text.parse().unwrap();
            let reparsed: Qty = parsed.to_string().parse().unwrap();
            prop_assert_eq!(parsed, reparsed);
        }
    }
}
