//! Where a query may run when the pool knows several hosts: the libpq
//! [`TargetSessionAttrs`], the read [`Consistency`] and its [`WriteToken`],
//! and what a read does when no standby fits ([`ReplicaFallback`]).

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Which kind of host an exclusive connection must reach; libpq's
/// `target_session_attrs`, all six values of PostgreSQL 14+, plus
/// `prefer-primary`. See [`Pool::get_with`](crate::Pool::get_with).
///
/// Accepted in a URL (`?target_session_attrs=standby`) too, where it sets
/// the host that [`Pool::get`](crate::Pool::get) reaches. tokio-postgres
/// 0.7.18 knows only the first three and rejects the rest, so pgpipe reads
/// the key itself before handing the URL on.
///
/// | value | reaches |
/// |---|---|
/// | `Any` | the primary, else a standby |
/// | `ReadWrite`, `Primary` | the primary |
/// | `ReadOnly` | a standby, else the primary opened read-only |
/// | `Standby` | a standby, else [`ErrorKind::NoReplica`](crate::ErrorKind::NoReplica) |
/// | `PreferStandby` | a standby, else the primary (writable) |
/// | `PreferPrimary` | the primary, else a standby |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TargetSessionAttrs {
    /// Any host; pgpipe prefers the primary.
    #[default]
    Any,
    /// A host that accepts writes: the primary.
    ReadWrite,
    /// A session that refuses writes.
    ReadOnly,
    /// The primary.
    Primary,
    /// A standby only.
    Standby,
    /// A standby if there is one, else the primary.
    PreferStandby,
    /// The primary if there is one, else a standby.
    PreferPrimary,
}

impl TargetSessionAttrs {
    /// libpq's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
            TargetSessionAttrs::PreferPrimary => "prefer-primary",
        }
    }

    const ALL: [TargetSessionAttrs; 7] = [
        TargetSessionAttrs::Any,
        TargetSessionAttrs::ReadWrite,
        TargetSessionAttrs::ReadOnly,
        TargetSessionAttrs::Primary,
        TargetSessionAttrs::Standby,
        TargetSessionAttrs::PreferStandby,
        TargetSessionAttrs::PreferPrimary,
    ];
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = Error;

    /// libpq's spellings; anything else is a
    /// [`Config`](crate::ErrorKind::Config) error.
    fn from_str(value: &str) -> Result<Self, Error> {
        TargetSessionAttrs::ALL
            .into_iter()
            .find(|t| t.as_str() == value)
            .ok_or_else(|| {
                Error::config(format!(
                    "target_session_attrs={value:?} is not one of any, read-write, read-only, \
                     primary, standby, prefer-standby, prefer-primary"
                ))
            })
    }
}

/// What a read through [`Pool::read_with`](crate::Pool::read_with) must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Consistency {
    /// Whatever a standby within `max_replica_lag` has replayed:
    /// [`Pool::read`](crate::Pool::read).
    #[default]
    Eventual,
    /// At least the write that returned this token: a standby known to
    /// have replayed it, else the primary. A token from before a failover
    /// (another timeline) always goes to the primary.
    AtLeast(WriteToken),
    /// The primary (through a read-only session).
    Strong,
}

/// Where a committed write left the primary's WAL: from
/// [`Pool::execute_tracked`](crate::Pool::execute_tracked), for
/// [`Consistency::AtLeast`]. Its text form (`2/0/16B3748`: timeline, then
/// the LSN as PostgreSQL prints it) fits in a cookie or a header.
///
/// ```
/// let token: pgpipe::WriteToken = "1/0/16B3748".parse().unwrap();
/// assert_eq!(token.to_string(), "1/0/16B3748");
/// assert_eq!(token.lsn, 0x16B3748);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WriteToken {
    /// The timeline of the primary that took the write; `(timeline, lsn)`
    /// order, so that a later timeline is later.
    pub timeline: u32,
    /// A WAL position at or after the write's commit record.
    pub lsn: u64,
}

impl WriteToken {
    /// A token that no standby vouches for: reads with it go to the
    /// primary. [`Pool::execute_tracked`](crate::Pool::execute_tracked)
    /// returns it when the write's position could not be read.
    pub const PRIMARY: WriteToken = WriteToken {
        timeline: 0,
        lsn: u64::MAX,
    };
}

impl fmt::Display for WriteToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{:X}/{:X}",
            self.timeline,
            self.lsn >> 32,
            self.lsn & 0xffff_ffff
        )
    }
}

impl FromStr for WriteToken {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = || {
            Error::config(format!(
                "{text:?} is not a write token (timeline/XX/XXXXXXXX)"
            ))
        };
        let mut parts = text.splitn(3, '/');
        let (Some(timeline), Some(high), Some(low)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let timeline = timeline.parse::<u32>().map_err(|_| bad())?;
        let high = u64::from_str_radix(high, 16).map_err(|_| bad())?;
        let low = u64::from_str_radix(low, 16).map_err(|_| bad())?;
        if high > u64::from(u32::MAX) || low > u64::from(u32::MAX) {
            return Err(bad());
        }
        Ok(WriteToken {
            timeline,
            lsn: high << 32 | low,
        })
    }
}

/// What a read does when no standby fits (none configured, all down, all
/// lagging, none has replayed the token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ReplicaFallback {
    /// Read from the primary, through connections opened read-only
    /// (`default_transaction_read_only=on`), so that a write through the
    /// read handle fails there as it would on a standby.
    #[default]
    Primary,
    /// Fail with [`ErrorKind::NoReplica`](crate::ErrorKind::NoReplica).
    Fail,
}

/// Takes `target_session_attrs` out of a connection string (URL or
/// `key=value`), which tokio-postgres would reject for the values it does
/// not know; returns the rest and the value, if any.
pub(crate) fn take_target(url: &str) -> Result<(String, Option<TargetSessionAttrs>), Error> {
    let (rest, value) = take_param(url, "target_session_attrs")?;
    Ok((rest, value.map(|v| v.parse()).transpose()?))
}

/// Takes the parameter `key` out of a connection string (URL or
/// `key=value`): the rest, and its value (percent-decoded in a URL), if
/// any.
pub(crate) fn take_param(url: &str, key: &str) -> Result<(String, Option<String>), Error> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if is_url {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), None));
        };
        let mut found = None;
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some((k, value)) if k == key => found = Some(percent_decoded(value)?),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, found));
    }
    // key=value: cut out just `key = value` (libpq allows spaces around
    // `=`, and quotes), leaving every other byte as it was (a quoted
    // password keeps its spaces).
    let bytes = url.as_bytes();
    let mut at = 0;
    while let Some(offset) = url[at..].find(key) {
        let start = at + offset;
        let mut i = start + key.len();
        at = i;
        if start > 0 && !bytes[start - 1].is_ascii_whitespace() {
            continue;
        }
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            continue;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let quoted = bytes.get(i) == Some(&b'\'');
        let value_start = i + usize::from(quoted);
        let mut end = value_start;
        while end < bytes.len()
            && !(if quoted {
                bytes[end] == b'\''
            } else {
                bytes[end].is_ascii_whitespace()
            })
        {
            end += 1;
        }
        let value = url[value_start..end].to_owned();
        let end = (end + usize::from(quoted)).min(bytes.len());
        let rest = format!("{}{}", &url[..start], &url[end..]);
        return Ok((rest.trim().to_owned(), Some(value)));
    }
    Ok((url.to_owned(), None))
}

/// A URL parameter's value with its `%XX` escapes decoded.
fn percent_decoded(value: &str) -> Result<String, Error> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::config(format!("a bad %-escape in {value:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::config(format!("{value:?} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn every_libpq_value_parses_and_prints_back() {
        for target in TargetSessionAttrs::ALL {
            assert_eq!(
                target.as_str().parse::<TargetSessionAttrs>().unwrap(),
                target
            );
        }
        let error = "standbys".parse::<TargetSessionAttrs>().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
    }

    #[test]
    fn the_target_is_taken_out_of_urls_and_key_value_strings() {
        let (rest, target) =
            take_target("postgres://u@a:1,b:2/db?sslmode=disable&target_session_attrs=standby")
                .unwrap();
        assert_eq!(rest, "postgres://u@a:1,b:2/db?sslmode=disable");
        assert_eq!(target, Some(TargetSessionAttrs::Standby));
        let (rest, target) = take_target("postgres://u@a/db?target_session_attrs=primary").unwrap();
        assert_eq!(rest, "postgres://u@a/db");
        assert_eq!(target, Some(TargetSessionAttrs::Primary));
        let (rest, target) =
            take_target("host=a,b user=u target_session_attrs=prefer-standby").unwrap();
        assert_eq!(rest, "host=a,b user=u");
        assert_eq!(target, Some(TargetSessionAttrs::PreferStandby));
        let (rest, target) =
            take_target("host=a password='two  spaces' target_session_attrs = 'standby' dbname=d")
                .unwrap();
        assert_eq!(rest, "host=a password='two  spaces'  dbname=d");
        assert_eq!(target, Some(TargetSessionAttrs::Standby));
        let (rest, target) = take_target("host=a options=-ctarget_session_attrs=x").unwrap();
        assert_eq!(
            (rest.as_str(), target),
            ("host=a options=-ctarget_session_attrs=x", None)
        );
        let error = take_target("postgres://a/db?target_session_attrs=nope").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        assert_eq!(take_target("postgres://a/db").unwrap().1, None);
    }

    #[test]
    fn tokens_round_trip_and_order_by_timeline_first() {
        let a = WriteToken {
            timeline: 1,
            lsn: 0x1_0000_0010,
        };
        assert_eq!(a.to_string(), "1/1/10");
        assert_eq!(a.to_string().parse::<WriteToken>().unwrap(), a);
        let b = WriteToken {
            timeline: 2,
            lsn: 5,
        };
        assert!(b > a);
        for bad in ["", "1/2", "x/1/2", "1/1/zz", "1/100000000/0"] {
            assert!(bad.parse::<WriteToken>().is_err(), "{bad}");
        }
    }
}
