//! The wire form of ledger effects, as replicated and written to the AOF:
//!
//! `QUOTA.APPLY key at_ms EFFECT args [EFFECT args ...]` with
//! - `CONFIG limit used overdraft max_reserve(-1 = none) default_ttl_ms period tz anchor|- start|- end|-`
//! - `RESET start_ms end_ms` (a period boundary passed)
//! - `GRANT id amount deadline_ms` · `SETTLE id actual` · `LATE id actual` · `ROLLBACK id`
//! - `RELEASE id` · `EXTEND id deadline_ms` · `CHARGE amount overrun` · `CHARGEID amount overrun id`
//! - `FORGET id`
//!
//! Every value is resolved (the master's time, generated ids, default TTLs), so applying the
//! same stream to the same state gives the same state on any server.

use redis_module::RedisError;

use crate::core::ledger::{Effect, Settings};
use crate::core::period::{Period, PeriodError, PeriodKind};
use crate::shell::args::{parse_i64, syntax_error};

/// Appends the tokens of one effect to `out`.
pub fn encode(effect: &Effect, out: &mut Vec<Vec<u8>>) {
    fn num(n: i64) -> Vec<u8> {
        n.to_string().into_bytes()
    }
    match effect {
        Effect::Configure {
            settings,
            used,
            period,
            bounds,
        } => {
            let opt = |v: Option<i64>| v.map_or_else(|| b"-".to_vec(), num);
            out.extend([
                b"CONFIG".to_vec(),
                num(settings.limit),
                num(*used),
                num(settings.overdraft),
                num(settings.max_reserve.unwrap_or(-1)),
                num(settings.default_ttl_ms),
                period.kind.as_str().as_bytes().to_vec(),
                period.tz.as_bytes().to_vec(),
                opt(period.anchor_ms),
                opt(bounds.map(|b| b.0)),
                opt(bounds.map(|b| b.1)),
            ])
        }
        Effect::Reset { start_ms, end_ms } => {
            out.extend([b"RESET".to_vec(), num(*start_ms), num(*end_ms)])
        }
        Effect::Grant {
            id,
            amount,
            deadline_ms,
        } => out.extend([
            b"GRANT".to_vec(),
            id.to_vec(),
            num(*amount),
            num(*deadline_ms),
        ]),
        Effect::Settle { id, actual } => {
            out.extend([b"SETTLE".to_vec(), id.to_vec(), num(*actual)])
        }
        Effect::SettleLate { id, actual } => {
            out.extend([b"LATE".to_vec(), id.to_vec(), num(*actual)])
        }
        Effect::Rollback { id } => out.extend([b"ROLLBACK".to_vec(), id.to_vec()]),
        Effect::Release { id } => out.extend([b"RELEASE".to_vec(), id.to_vec()]),
        Effect::Extend { id, deadline_ms } => {
            out.extend([b"EXTEND".to_vec(), id.to_vec(), num(*deadline_ms)])
        }
        Effect::Charge {
            amount,
            overrun,
            id: None,
        } => out.extend([b"CHARGE".to_vec(), num(*amount), num(*overrun)]),
        Effect::Charge {
            amount,
            overrun,
            id: Some(id),
        } => out.extend([
            b"CHARGEID".to_vec(),
            num(*amount),
            num(*overrun),
            id.to_vec(),
        ]),
        Effect::Forget { id } => out.extend([b"FORGET".to_vec(), id.to_vec()]),
    }
}

fn period_err(e: PeriodError) -> RedisError {
    RedisError::String(e.to_string())
}

/// `-` or an integer.
fn parse_opt(token: &[u8]) -> Result<Option<i64>, RedisError> {
    if token == b"-" {
        Ok(None)
    } else {
        parse_i64(token).map(Some)
    }
}

/// Parses effects from tokens (everything after `at_ms`).
pub fn decode<'a, I>(tokens: I) -> Result<Vec<Effect>, RedisError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut it = tokens.into_iter();
    let mut effects = Vec::new();
    let missing = || RedisError::Str("ERR QUOTA.APPLY: an effect is missing an argument");
    let next = |it: &mut I::IntoIter| it.next().ok_or_else(missing);
    while let Some(op) = it.next() {
        let effect = match op {
            b"CONFIG" => {
                let limit = parse_i64(next(&mut it)?)?;
                let used = parse_i64(next(&mut it)?)?;
                let overdraft = parse_i64(next(&mut it)?)?;
                let max = parse_i64(next(&mut it)?)?;
                let default_ttl_ms = parse_i64(next(&mut it)?)?;
                let kind = PeriodKind::parse(next(&mut it)?).map_err(period_err)?;
                let tz = next(&mut it)?;
                let anchor = parse_opt(next(&mut it)?)?;
                let start = parse_opt(next(&mut it)?)?;
                let end = parse_opt(next(&mut it)?)?;
                let bounds = match (start, end) {
                    (Some(s), Some(e)) => Some((s, e)),
                    (None, None) => None,
                    _ => return Err(RedisError::Str("ERR QUOTA.APPLY: half a period")),
                };
                Effect::Configure {
                    settings: Settings {
                        limit,
                        overdraft,
                        max_reserve: (max >= 0).then_some(max),
                        default_ttl_ms,
                    },
                    used,
                    period: Period::new(kind, tz, anchor).map_err(period_err)?,
                    bounds,
                }
            }
            b"RESET" => Effect::Reset {
                start_ms: parse_i64(next(&mut it)?)?,
                end_ms: parse_i64(next(&mut it)?)?,
            },
            b"GRANT" => Effect::Grant {
                id: next(&mut it)?.into(),
                amount: parse_i64(next(&mut it)?)?,
                deadline_ms: parse_i64(next(&mut it)?)?,
            },
            b"SETTLE" => Effect::Settle {
                id: next(&mut it)?.into(),
                actual: parse_i64(next(&mut it)?)?,
            },
            b"LATE" => Effect::SettleLate {
                id: next(&mut it)?.into(),
                actual: parse_i64(next(&mut it)?)?,
            },
            b"ROLLBACK" => Effect::Rollback {
                id: next(&mut it)?.into(),
            },
            b"RELEASE" => Effect::Release {
                id: next(&mut it)?.into(),
            },
            b"EXTEND" => Effect::Extend {
                id: next(&mut it)?.into(),
                deadline_ms: parse_i64(next(&mut it)?)?,
            },
            b"CHARGE" => Effect::Charge {
                amount: parse_i64(next(&mut it)?)?,
                overrun: parse_i64(next(&mut it)?)?,
                id: None,
            },
            b"CHARGEID" => Effect::Charge {
                amount: parse_i64(next(&mut it)?)?,
                overrun: parse_i64(next(&mut it)?)?,
                id: Some(next(&mut it)?.into()),
            },
            b"FORGET" => Effect::Forget {
                id: next(&mut it)?.into(),
            },
            other => return Err(syntax_error(other)),
        };
        effects.push(effect);
    }
    Ok(effects)
}
