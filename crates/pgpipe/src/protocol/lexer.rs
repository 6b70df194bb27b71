//! The SQL lexer the [`sql_guard`](super::sql_guard) reads statements with:
//! words, quoted identifiers and punctuation, with comments, literals and
//! dollar quotes skipped.

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
}

/// Splits SQL into [`Token`]s, skipping comments and the insides of literals.
pub(crate) struct Lexer<'a> {
    sql: &'a [u8],
    at: usize,
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(sql: &'a [u8]) -> Lexer<'a> {
        Lexer { sql, at: 0 }
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

    /// At a `$`: a dollar-quoted string (`$$…$$`, `$tag$…$tag$`) or a
    /// parameter (`$1`).
    fn skip_dollar(&mut self) {
        let rest = &self.sql[self.at..];
        let tag_len = rest[1..]
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
            .map(|n| n + 1);
        match tag_len {
            Some(n) if rest[n] == b'$' && !rest[1].is_ascii_digit() => {
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

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        loop {
            let c = self.peek(0)?;
            match c {
                // PostgreSQL 17 reads a vertical tab as white space too.
                c if c.is_ascii_whitespace() || c == 0x0b => self.at += 1,
                b'-' if self.peek(1) == Some(b'-') => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                b'/' if self.peek(1) == Some(b'*') => self.skip_block_comment(),
                b'\'' => {
                    self.skip_quoted(b'\'', false);
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
                c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                    let start = self.at;
                    while self.peek(0).is_some_and(|c| {
                        c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
                    }) {
                        self.at += 1;
                    }
                    let word = &self.sql[start..self.at];
                    // E'…' strings take backslash escapes.
                    if (word == b"e" || word == b"E") && self.peek(0) == Some(b'\'') {
                        self.skip_quoted(b'\'', true);
                        return Some(Token::Other);
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
