//! `strftime` over a UTC Unix time, for templates' `strftime_now` (Llama 3's
//! `strftime_now("%d %b %Y")`): the C directives templates use, the date from Hinnant's
//! `civil_from_days`. An unknown directive is refused by name rather than printed wrong.

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` with `%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%` (and glibc's `%-d`,
/// `%-m`, `%-H`, `%-I`, `%-M`, `%-S`, `%-j` without padding) at `unix_seconds`, UTC.
pub fn strftime(format: &str, unix_seconds: i64) -> Result<String, String> {
    let days = unix_seconds.div_euclid(86_400);
    let seconds = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next().ok_or("strftime format ends in `%`")?;
        let pad = if directive == '-' {
            directive = chars.next().ok_or("strftime format ends in `%-`")?;
            false
        } else {
            true
        };
        let number = |n: i64, width: usize| {
            if pad {
                format!("{n:0width$}")
            } else {
                n.to_string()
            }
        };
        let text = match directive {
            'Y' => year.to_string(),
            'y' => number(year.rem_euclid(100), 2),
            'm' => number(month, 2),
            'd' => number(day, 2),
            'e' => format!("{day:>2}"),
            'H' => number(hour, 2),
            'I' => number(hour12, 2),
            'M' => number(minute, 2),
            'S' => number(second, 2),
            'j' => number(day_of_year, 3),
            'p' => if hour < 12 { "AM" } else { "PM" }.to_string(),
            'b' => MONTHS[month as usize - 1][..3].to_string(),
            'B' => MONTHS[month as usize - 1].to_string(),
            'a' => WEEKDAYS[weekday][..3].to_string(),
            'A' => WEEKDAYS[weekday].to_string(),
            '%' => "%".to_string(),
            other => return Err(format!("strftime directive `%{other}` is not supported")),
        };
        out.push_str(&text);
    }
    Ok(out)
}

/// (year, month 1..=12, day 1..=31) of a day count from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day count from 1970-01-01 of a date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn dates_match_c_strftime() {
        // 2024-07-26 13:05:09 UTC, a Friday (Llama 3.1's default date_string day).
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %H:%M:%S %p %j %y %I %%", t).unwrap(),
            "Friday July 26, 13:05:09 PM 208 24 01 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(
            strftime("%Y-%m-%d %a", 951_782_400).unwrap(),
            "2000-02-29 Tue"
        );
        assert!(strftime("%Q", 0).unwrap_err().contains("%Q"));
    }
}
