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
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
)]
pub struct QuantityError(pub String);

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

    /// A whole number of units (cores, bytes, devices).
    pub fn from_units(units: i64, format: Format) -> Self {
        Self {
            milli: units as i128 * 1000,
            format,
        }
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

    pub fn to_quantity(self) -> Quantity {
        Quantity(self.to_string())
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

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || QuantityError(text.to_owned());
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err());
        }
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits: String = format!("{whole}{frac}");
        let mantissa: i128 = digits.parse().map_err(|_| err())?;
        // value = mantissa * 10^(-frac_len) * scale
        let frac_len = frac.len() as i32;

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
            .checked_mul(1i128.checked_shl(two_exp).ok_or_else(err)?)
            .ok_or_else(err)?;
        let exp10 = ten_exp - frac_len + 3;
        let milli = if exp10 >= 0 {
            scaled
                .checked_mul(pow10(exp10 as u32).ok_or_else(err)?)
                .ok_or_else(err)?
        } else {
            let div = pow10((-exp10) as u32).ok_or_else(err)?;
            scaled / div + i128::from(scaled % div != 0)
        };
        Ok(Qty {
            milli: if negative { -milli } else { milli },
            format,
        })
    }
}

impl fmt::Display for Qty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli == 0 {
            return f.write_str("0");
        }
        let sign = if self.milli < 0 { "-" } else { "" };
        let abs = self.milli.unsigned_abs();
        // Binary form only for whole values of at least 1024 (as the API server canonicalises).
        if self.format == Format::BinarySI && abs.is_multiple_of(1000) && abs / 1000 >= 1024 {
            let mut value = abs / 1000;
            let mut suffix = "";
            for (s, _) in BINARY_SUFFIXES {
                if !value.is_multiple_of(1024) {
                    break;
                }
                value /= 1024;
                suffix = s;
            }
            return write!(f, "{sign}{value}{suffix}");
        }
        if !abs.is_multiple_of(1000) {
            return write!(f, "{sign}{abs}m");
        }
        let mut value = abs / 1000;
        let mut suffix = "";
        for (s, e) in DECIMAL_SUFFIXES.iter().filter(|(_, e)| *e > 0) {
            let _ = e;
            if !value.is_multiple_of(1000) {
                break;
            }
            value /= 1000;
            suffix = s;
        }
        write!(f, "{sign}{value}{suffix}")
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
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "abc", "1.2.3", "1Qi", ".", "--1", "1e", "m"] {
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
