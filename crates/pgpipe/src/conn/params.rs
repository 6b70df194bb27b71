//! Checks made before anything is sent: the SQL's size, the parameters'
//! count, types and size. A request the server would refuse at the protocol
//! level makes it drop the connection, and with it every query pipelined on
//! it, so such a request is refused here, alone.

use bytes::BytesMut;
use tokio_postgres::types::{ToSql, Type};

use crate::error::{Error, ErrorKind};

/// A query's parameters, as tokio-postgres takes them.
pub(crate) type Params<'a, 'b> = &'a [&'b (dyn ToSql + Sync)];

/// The server drops the connection on a message of 1 GiB or more (the
/// protocol's own length field would allow 2 GiB).
const MAX_MESSAGE: usize = (1 << 30) - 1;

/// Refuses SQL text the server would not accept in one message.
#[inline]
pub(crate) fn check_sql_size(sql: &str) -> Result<(), Error> {
    if sql.len() >= MAX_MESSAGE {
        return Err(too_large_request(sql.len()));
    }
    Ok(())
}

/// Checks that `params` fit a statement's parameter `types`, before
/// anything is sent. With
/// `every`, values of fixed-size types are encoded too, so that a type
/// mismatch surfaces here rather than when tokio-postgres encodes the
/// request (which then sends nothing for this query, and everything else).
#[inline]
pub(crate) fn check_params(
    types: &[Type],
    params: Params<'_, '_>,
    every: bool,
) -> Result<(), Error> {
    check_param_count(types, params)?;
    check_request_size(types, params, every)
}

fn too_large_request(bytes: usize) -> Error {
    Error::new(
        ErrorKind::TooLarge,
        format!(
            "the request is {bytes} bytes; the server accepts messages under 1 GiB and would \
             drop the connection (and every query sharing it); nothing was sent"
        ),
    )
}

/// Types whose values have a fixed, small size: no need to measure them.
const FIXED_SIZE: &[Type] = &[
    Type::BOOL,
    Type::CHAR,
    Type::INT2,
    Type::INT4,
    Type::INT8,
    Type::OID,
    Type::FLOAT4,
    Type::FLOAT8,
    Type::DATE,
    Type::TIME,
    Type::TIMETZ,
    Type::TIMESTAMP,
    Type::TIMESTAMPTZ,
    Type::INTERVAL,
    Type::UUID,
    Type::MONEY,
];

thread_local! {
    /// Where parameters are encoded to be measured; reused, so measuring
    /// allocates nothing in the common case.
    static SCRATCH: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Refuses a request the server would not accept before it is encoded for
/// real: a Bind message of 1 GiB or more makes the server drop the
/// connection, and with it every query pipelined on it. Variable-size
/// parameters are encoded once into a scratch buffer to learn their size.
fn check_request_size(types: &[Type], params: Params<'_, '_>, every: bool) -> Result<(), Error> {
    // The Bind message's own overhead: its header, names and format codes,
    // plus a length word and a format code per parameter.
    let mut total = 64 + 8 * params.len();
    for (i, (param, ty)) in params.iter().zip(types).enumerate() {
        if !every && FIXED_SIZE.contains(ty) {
            continue;
        }
        let size = SCRATCH.with(|scratch| {
            let mut buf = scratch.borrow_mut();
            buf.clear();
            let result = param.to_sql_checked(ty, &mut buf).map(|_| buf.len());
            if buf.capacity() > 1 << 20 {
                *buf = BytesMut::new(); // do not keep a huge buffer around
            }
            result
        });
        match size {
            Ok(size) => total = total.saturating_add(size),
            Err(e) => {
                return Err(Error::with_source(
                    ErrorKind::Params,
                    format!("parameter ${} cannot be sent as {ty}", i + 1),
                    e,
                ));
            }
        }
        if total >= MAX_MESSAGE {
            return Err(too_large_request(total));
        }
    }
    Ok(())
}

fn check_param_count(types: &[Type], params: Params<'_, '_>) -> Result<(), Error> {
    let expected = types.len();
    if params.len() == expected {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Params,
            format!(
                "the statement takes {expected} parameters but {} were given",
                params.len()
            ),
        ))
    }
}
