//! Wall-clock instants as calendar dates, for the tables operators read. Records carry Unix
//! nanoseconds (UTC); this turns them into dates without a time-zone database.

/// A UTC calendar date and time of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilUtc {
    /// Year (proleptic Gregorian).
    pub year: i64,
    /// Month, 1-12.
    pub month: i64,
    /// Day of the month, 1-31.
    pub day: i64,
    /// Hour, 0-23.
    pub hour: i64,
    /// Minute, 0-59.
    pub minute: i64,
    /// Second, 0-59.
    pub second: i64,
}

/// The calendar date of `unix_s` seconds since the Unix epoch (negative: before it).
pub fn civil_utc(unix_s: i64) -> CivilUtc {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    CivilUtc { year, month, day, hour: secs / 3_600, minute: secs % 3_600 / 60, second: secs % 60 }
}

/// The UTC date of `unix_s` as `YYYY-MM-DD`: the name of `ctl collect`'s date directories.
pub fn utc_date(unix_s: i64) -> String {
    let c = civil_utc(unix_s);
    format!("{:04}-{:02}-{:02}", c.year, c.month, c.day)
}

/// Days since the Unix epoch of a `YYYY-MM-DD` name ([`utc_date`]); `None` for another name.
pub fn parse_utc_date(name: &str) -> Option<i64> {
    let b = name.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| name.get(r)?.parse::<u32>().ok();
    Some(days_from_civil(i64::from(num(0..4)?), num(5..7)?, num(8..10)?))
}

/// Days since the Unix epoch of the UTC date `year-month-day` (month 1-12, day 1-31): the
/// inverse of [`civil_utc`]'s date (Howard Hinnant's days_from_civil).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let (m, d) = (i64::from(month), i64::from(day));
    let y = if m <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        let c = |y, mo, d, h, mi, s| CivilUtc { year: y, month: mo, day: d, hour: h, minute: mi, second: s };
        assert_eq!(civil_utc(0), c(1970, 1, 1, 0, 0, 0));
        assert_eq!(civil_utc(1_700_000_000), c(2023, 11, 14, 22, 13, 20));
        assert_eq!(civil_utc(951_782_400), c(2000, 2, 29, 0, 0, 0));
        assert_eq!(civil_utc(-1), c(1969, 12, 31, 23, 59, 59));
    }

    #[test]
    fn days_from_civil_inverts_civil_utc() {
        for days in (-800_000..800_000).step_by(997) {
            let c = civil_utc(days * 86_400);
            assert_eq!(days_from_civil(c.year, c.month as u32, c.day as u32), days, "{c:?}");
        }
        assert_eq!(days_from_civil(2023, 11, 14), 1_700_000_000 / 86_400);
    }

    #[test]
    fn date_names_round_trip() {
        assert_eq!(utc_date(1_700_000_000), "2023-11-14");
        assert_eq!(parse_utc_date("2023-11-14"), Some(1_700_000_000 / 86_400));
        assert_eq!(parse_utc_date(&utc_date(951_782_400)), Some(951_782_400 / 86_400));
        for bad in ["damaged", "undated", "2023-1-14", "2023/11/14", "x023-11-14"] {
            assert_eq!(parse_utc_date(bad), None, "{bad}");
        }
    }
}
