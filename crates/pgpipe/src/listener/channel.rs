//! Channel names as SQL: checked, then quoted as PostgreSQL quotes an
//! identifier, so that no name can be anything but one channel.
//!
//! A quoted identifier is `"` … `"` with each `"` inside doubled; nothing
//! else is special in it (no backslash escapes, no `U&` unless written in
//! front of the quote). So a quoted name cannot end early, and what the
//! server stores is the name as given, byte for byte, case kept: the name a
//! notification comes back with.

use crate::error::{Error, ErrorKind};

/// The longest channel name PostgreSQL keeps whole: `NAMEDATALEN` − 1
/// bytes (64 − 1 in every standard build). A longer quoted name would be
/// cut there, and its notifications would come back under the cut name.
pub(super) const MAX_LEN: usize = 63;

/// `LISTEN "name"`, or the error that says why `name` cannot be a channel.
pub(super) fn listen(name: &str) -> Result<String, Error> {
    Ok(format!("LISTEN {}", quoted(name)?))
}

/// `UNLISTEN "name"`, as [`listen`].
pub(super) fn unlisten(name: &str) -> Result<String, Error> {
    Ok(format!("UNLISTEN {}", quoted(name)?))
}

/// One `LISTEN` for each of `names` (checked when they were first
/// listened to), as one simple query.
pub(super) fn listen_all<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .filter_map(|name| listen(name).ok())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `name` as a quoted identifier.
///
/// # Errors
///
/// [`ErrorKind::Params`] for a name that is empty (PostgreSQL refuses a
/// zero-length identifier), holds a NUL byte (the protocol's strings end at
/// one) or is longer than [`MAX_LEN`] bytes.
pub(super) fn quoted(name: &str) -> Result<String, Error> {
    let refuse = |why: &str| {
        Error::new(
            ErrorKind::Params,
            format!("channel name {name:?} {why}; nothing was sent"),
        )
    };
    if name.is_empty() {
        return Err(refuse("is empty"));
    }
    if name.contains('\0') {
        return Err(refuse("holds a NUL byte"));
    }
    if name.len() > MAX_LEN {
        return Err(refuse(&format!(
            "is {} bytes long, over PostgreSQL's {MAX_LEN}",
            name.len()
        )));
    }
    let mut sql = String::with_capacity(name.len() + 2);
    sql.push('"');
    for c in name.chars() {
        if c == '"' {
            sql.push('"');
        }
        sql.push(c);
    }
    sql.push('"');
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_quoted_as_given() {
        assert_eq!(quoted("orders").unwrap(), r#""orders""#);
        assert_eq!(quoted("Orders").unwrap(), r#""Orders""#);
        assert_eq!(listen("a b").unwrap(), r#"LISTEN "a b""#);
        assert_eq!(unlisten("ü").unwrap(), r#"UNLISTEN "ü""#);
    }

    #[test]
    fn a_quote_inside_is_doubled_so_the_name_cannot_end_early() {
        let hostile = r#"x"; DROP TABLE t; --"#;
        assert_eq!(quoted(hostile).unwrap(), r#""x""; DROP TABLE t; --""#);
        assert_eq!(quoted(r#"""#).unwrap(), r#""""""#);
        // Backslashes and dollar quotes mean nothing inside a quoted name.
        assert_eq!(quoted(r"a\").unwrap(), r#""a\""#);
        assert_eq!(quoted("$$").unwrap(), r#""$$""#);
    }

    #[test]
    fn names_the_server_would_refuse_or_cut_are_refused() {
        for name in ["", "a\0b"] {
            let e = quoted(name).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Params, "{name:?}");
        }
        assert!(quoted(&"a".repeat(MAX_LEN)).is_ok());
        let e = quoted(&"a".repeat(MAX_LEN + 1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Params);
        // Bytes, not characters: 32 two-byte letters are 64 bytes.
        assert!(quoted(&"é".repeat(32)).is_err());
    }

    #[test]
    fn every_channel_is_listened_to_in_one_query() {
        assert_eq!(listen_all(["a", "b\"c"]), r#"LISTEN "a"; LISTEN "b""c""#);
        assert_eq!(listen_all([]), "");
    }
}
