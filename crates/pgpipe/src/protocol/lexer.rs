//! The SQL lexer the [`sql_guard`](super::sql_guard) reads statements with:
//! words, quoted identifiers and punctuation, with comments, literals and
//! dollar quotes skipped.
//!
//! It follows PostgreSQL's own scanner (`scan.l`) where the boundaries of a
//! token are decided: a `--` comment ends at `\n` or `\r`; block comments
//! nest; dollar-quote tags and identifiers take bytes 0x80-0xff; numbers
//! (`1.5e3`, `.5`, `0x1F`, `1_000`) are one token, so their `.` is no
//! qualifier; `U&"…"` identifiers are [`Token::Escaped`], never decoded or
//! compared by name. Whether backslashes escape in plain strings depends on
//! the session's `standard_conforming_strings`: [`Lexer::backslash_strings`]
//! reads them the other way, and the guard takes the stricter verdict of
//! the two. A differential test holds all this against libpg_query's
//! scanner (`cargo test -p pgpipe --features pg-query-check`).

/// A lexical token; only what the checks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token<'a> {
    /// An unquoted identifier or keyword.
    Word(&'a [u8]),
    /// A double-quoted identifier's content.
    Quoted(&'a [u8]),
    /// A string literal, number, parameter or operator.
    Other,
    /// `(`, `)`, `,`, `;` or `.`.
    Punct(u8),
    /// A `U&"…"` identifier: a name the guard does not decode (Unicode
    /// escapes, `UESCAPE`), so it cannot tell what it names.
    Escaped,
}

/// Splits SQL into [`Token`]s, skipping comments and the insides of literals.
pub(crate) struct Lexer<'a> {
    sql: &'a [u8],
    at: usize,
    /// Plain strings take backslash escapes (`standard_conforming_strings`
    /// off).
    backslashes: bool,
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(sql: &'a [u8]) -> Lexer<'a> {
        Lexer {
            sql,
            at: 0,
            backslashes: false,
        }
    }

    /// A lexer that reads plain strings as a session with
    /// `standard_conforming_strings = off` does: `\'` does not end them.
    pub(crate) fn backslash_strings(sql: &'a [u8]) -> Lexer<'a> {
        Lexer {
            backslashes: true,
            ..Lexer::new(sql)
        }
    }

    fn peek(&self, offset: usize) -> Option<u8> {
        self.sql.get(self.at + offset).copied()
    }

    fn skip_block_comment(&mut self) {
        let mut depth = 0usize;
        while self.at < self.sql.len() {
            match (self.peek(0), self.peek(1)) {
                (Some(b'/'), Some(b'*')) => {
                    depth += 1;
                    self.at += 2;
                }
                (Some(b'*'), Some(b'/')) => {
                    depth -= 1;
                    self.at += 2;
                    if depth == 0 {
                        return;
                    }
                }
                _ => self.at += 1,
            }
        }
    }

    /// Skips a quoted run ending in `quote`, where a doubled quote is an
    /// escaped one (and, with `backslash`, so is `\` + anything).
    fn skip_quoted(&mut self, quote: u8, backslash: bool) -> &'a [u8] {
        let start = self.at + 1;
        self.at += 1;
        while let Some(c) = self.peek(0) {
            let escaped = (backslash && c == b'\\') || (c == quote && self.peek(1) == Some(quote));
            if escaped {
                self.at += 2;
            } else if c == quote {
                self.at += 1;
                return &self.sql[start..self.at - 1];
            } else {
                self.at += 1;
            }
        }
        &self.sql[start.min(self.sql.len())..]
    }

    /// A string literal and its continuations: a string followed by white
    /// space with a newline in it (and comments on lines of their own) and
    /// another quote goes on, in the same escape mode (PostgreSQL's
    /// `quotecontinue`).
    fn skip_string(&mut self, backslash: bool) {
        loop {
            self.skip_quoted(b'\'', backslash);
            match self.continuation() {
                Some(quote) => self.at = quote,
                None => return,
            }
        }
    }

    /// Where a string's continuation quote stands, if one follows.
    fn continuation(&self) -> Option<usize> {
        let mut at = self.at;
        let byte = |at: usize| self.sql.get(at).copied();
        // White space on the string's own line, a comment included.
        loop {
            match byte(at) {
                Some(b' ' | b'\t' | 0x0c | 0x0b) => at += 1,
                Some(b'-') if byte(at + 1) == Some(b'-') => {
                    while byte(at).is_some_and(|c| c != b'\n' && c != b'\r') {
                        at += 1;
                    }
                }
                _ => break,
            }
        }
        if !matches!(byte(at), Some(b'\n' | b'\r')) {
            return None;
        }
        loop {
            match byte(at) {
                Some(b' ' | b'\t' | b'\n' | b'\r' | 0x0c | 0x0b) => at += 1,
                Some(b'-') if byte(at + 1) == Some(b'-') => {
                    while byte(at).is_some_and(|c| c != b'\n' && c != b'\r') {
                        at += 1;
                    }
                    // A comment counts only with the newline that ends it.
                    byte(at)?;
                }
                Some(b'\'') => return Some(at),
                _ => return None,
            }
        }
    }

    /// At a `$`: a dollar-quoted string (`$$…$$`, `$tag$…$tag$`) or a
    /// parameter (`$1`).
    fn skip_dollar(&mut self) {
        let rest = &self.sql[self.at..];
        // `$` then a tag of identifier bytes (not starting with a digit),
        // then `$`: PostgreSQL's `dolqdelim`.
        let tag_len = rest[1..]
            .iter()
            .position(|c| !is_ident_byte(*c))
            .map(|n| n + 1);
        match tag_len {
            Some(n) if rest[n] == b'$' && (n == 1 || !rest[1].is_ascii_digit()) => {
                let tag = &rest[..=n];
                let body = &rest[n + 1..];
                let end = body
                    .windows(tag.len())
                    .position(|w| w == tag)
                    .map_or(body.len(), |p| p + tag.len());
                self.at += n + 1 + end;
            }
            _ => {
                self.at += 1;
                while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
                    self.at += 1;
                }
            }
        }
    }
}

impl Lexer<'_> {
    /// A numeric literal, as PostgreSQL's scanner reads one: a `0x`/`0o`/
    /// `0b` integer, or digits (with `_` separators), one fraction, one
    /// exponent; identifier bytes right behind are taken too (PostgreSQL
    /// refuses them as "trailing junk").
    fn skip_number(&mut self) {
        let digits = |lexer: &mut Self| {
            while lexer
                .peek(0)
                .is_some_and(|c| c.is_ascii_digit() || c == b'_')
            {
                lexer.at += 1;
            }
        };
        let radix = matches!(self.peek(1), Some(b'x' | b'X' | b'o' | b'O' | b'b' | b'B'));
        if self.peek(0) == Some(b'0') && radix {
            self.at += 2;
        } else {
            digits(self);
            if self.peek(0) == Some(b'.') && self.peek(1) != Some(b'.') {
                self.at += 1;
                digits(self);
            }
            if matches!(self.peek(0), Some(b'e' | b'E')) {
                let sign = usize::from(matches!(self.peek(1), Some(b'+' | b'-')));
                if self.peek(1 + sign).is_some_and(|c| c.is_ascii_digit()) {
                    self.at += 1 + sign;
                    digits(self);
                }
            }
        }
        while self.peek(0).is_some_and(is_ident_byte) {
            self.at += 1;
        }
    }
}

/// PostgreSQL's `ident_start`: a letter, `_`, or any byte 0x80-0xff.
fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

/// PostgreSQL's `ident_cont` without `$`: also digits.
fn is_ident_byte(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        loop {
            let c = self.peek(0)?;
            match c {
                // PostgreSQL 17 reads a vertical tab as white space too.
                c if c.is_ascii_whitespace() || c == 0x0b => self.at += 1,
                // PostgreSQL's `comment`: up to a newline or a carriage return.
                b'-' if self.peek(1) == Some(b'-') => {
                    while self.peek(0).is_some_and(|c| c != b'\n' && c != b'\r') {
                        self.at += 1;
                    }
                }
                b'/' if self.peek(1) == Some(b'*') => self.skip_block_comment(),
                b'\'' => {
                    self.skip_string(self.backslashes);
                    return Some(Token::Other);
                }
                c if c.is_ascii_digit()
                    || (c == b'.' && self.peek(1).is_some_and(|d| d.is_ascii_digit())) =>
                {
                    self.skip_number();
                    return Some(Token::Other);
                }
                b'"' => return Some(Token::Quoted(self.skip_quoted(b'"', false))),
                b'$' => {
                    self.skip_dollar();
                    return Some(Token::Other);
                }
                b'(' | b')' | b',' | b';' | b'.' => {
                    self.at += 1;
                    return Some(Token::Punct(c));
                }
                c if is_ident_start(c) => {
                    let start = self.at;
                    while self.peek(0).is_some_and(|c| is_ident_byte(c) || c == b'$') {
                        self.at += 1;
                    }
                    let word = &self.sql[start..self.at];
                    // E'…' strings take backslash escapes.
                    if (word == b"e" || word == b"E") && self.peek(0) == Some(b'\'') {
                        self.skip_string(true);
                        return Some(Token::Other);
                    }
                    // B'…' and X'…': bit strings, one token; no escapes.
                    if matches!(word, b"b" | b"B" | b"x" | b"X") && self.peek(0) == Some(b'\'') {
                        self.skip_string(false);
                        return Some(Token::Other);
                    }
                    // U&'…' strings and U&"…" identifiers.
                    if (word == b"u" || word == b"U") && self.peek(0) == Some(b'&') {
                        match self.peek(1) {
                            Some(b'\'') => {
                                self.at += 1;
                                self.skip_string(false);
                                return Some(Token::Other);
                            }
                            Some(b'"') => {
                                self.at += 1;
                                self.skip_quoted(b'"', false);
                                return Some(Token::Escaped);
                            }
                            _ => {}
                        }
                    }
                    return Some(Token::Word(word));
                }
                _ => {
                    self.at += 1;
                    return Some(Token::Other);
                }
            }
        }
    }
}
