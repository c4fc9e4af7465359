//! The documentation of every `QUOTA.*` command, held by the server: `COMMAND DOCS` (summary,
//! since, complexity, arguments), `COMMAND INFO` (arity, key specs, so `COMMAND GETKEYS` and
//! cluster routing), the hints redis-cli shows as one types, `QUOTA.HELP`, and the usage line
//! of an argument error ([`crate::shell::args`]).
//!
//! One table, [`COMMANDS`], set at load with raw `RedisModule_GetCommand` +
//! `RedisModule_SetCommandInfo` (both present on Redis 7.0 and Valkey 8). A new option is one
//! line in its command's `args`; a new command is one entry. Redis copies what it is given, so
//! the C structs only live during [`set_all`].
//!
//! Arity: the client commands declare `-2` (the key and anything after it) rather than their
//! true minimum, so that a short call reaches the command and its error can carry the usage
//! line; the command checks its own minimum. The internal commands declare their minimum.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

/// The `since` of every command of the first release.
const V0_1: &CStr = c"0.1.0";

/// What an argument is: its `type` in `COMMAND DOCS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A key name, with the index of its spec in the command's `keys`.
    Key(c_int),
    Integer,
    String,
    /// A unix time in ms.
    UnixTime,
    /// A keyword alone (`NX`, `PEEK`).
    PureToken,
    /// Exactly one of `subargs`.
    OneOf,
    /// `subargs` in sequence.
    Block,
}

/// One argument of a command (or of a `OneOf` / `Block`).
#[derive(Debug)]
pub struct Arg {
    /// Its name in `COMMAND DOCS`, and its value's placeholder in hints and usage lines (Redis
    /// 7.0 has no `display_text`: redis-cli shows the name), as in `[COUNT count]`.
    pub name: &'static CStr,
    pub kind: Kind,
    /// The keyword before its value (`TTL`), or the keyword itself (a `PureToken`).
    pub token: Option<&'static CStr>,
    pub optional: bool,
    pub multiple: bool,
    pub summary: Option<&'static CStr>,
    pub subargs: &'static [Arg],
    /// Non-empty: this option makes a form of the command of its own, taking only the
    /// arguments named here (by [`Arg::name`]) besides it (`QUOTA.SET key WINDOW ...
    /// [NX|XX] [AT unix_ms]`). `QUOTA.HELP` shows each form on its own line.
    pub only_with: &'static [&'static CStr],
}

impl Arg {
    const fn new(name: &'static CStr, kind: Kind) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
            summary: None,
            subargs: &[],
            only_with: &[],
        }
    }

    /// The same argument, repeatable (`key [key ...]`).
    pub const fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }

    /// The same argument, optional.
    pub const fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }

    /// The same argument, required (a [`one_of`] in a fixed position: `actual|ELAPSED`).
    pub const fn required(mut self) -> Arg {
        self.optional = false;
        self
    }

    /// The same argument with a one-line description.
    pub const fn summary(mut self, summary: &'static CStr) -> Arg {
        self.summary = Some(summary);
        self
    }

    /// The placeholder shown for the argument's value: its name.
    pub fn placeholder(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

/// The key of a one-key command (key spec 0).
pub const fn key() -> Arg {
    Arg::new(c"key", Kind::Key(0))
}

/// A required positional integer.
pub const fn int(name: &'static CStr) -> Arg {
    Arg::new(name, Kind::Integer)
}

/// A required positional string.
pub const fn string(name: &'static CStr) -> Arg {
    Arg::new(name, Kind::String)
}

/// An optional `TOKEN value` pair; `name` is the value's placeholder (`[TTL ttl_ms]`).
pub const fn option(token: &'static CStr, name: &'static CStr, kind: Kind) -> Arg {
    let mut a = Arg::new(name, kind);
    a.token = Some(token);
    a.optional = true;
    a
}

/// An optional keyword alone (`FORCE`).
pub const fn flag(token: &'static CStr, name: &'static CStr) -> Arg {
    let mut a = Arg::new(name, Kind::PureToken);
    a.token = Some(token);
    a.optional = true;
    a
}

/// A keyword that is one alternative of a [`one_of`].
pub const fn word(token: &'static CStr, name: &'static CStr) -> Arg {
    let mut a = flag(token, name);
    a.optional = false;
    a
}

/// An optional choice of `alternatives`, after `token` if there is one (`[PERIOD DAY|...]`,
/// `[NX|XX]`).
pub const fn one_of(
    token: Option<&'static CStr>,
    name: &'static CStr,
    alternatives: &'static [Arg],
) -> Arg {
    let mut a = Arg::new(name, Kind::OneOf);
    a.token = token;
    a.optional = true;
    a.subargs = alternatives;
    a
}

/// `subargs` in sequence, as one argument (a repeated group).
pub const fn block(name: &'static CStr, subargs: &'static [Arg]) -> Arg {
    let mut a = Arg::new(name, Kind::Block);
    a.subargs = subargs;
    a
}

/// The test clock option every time-dependent command takes.
pub const AT: Arg = option(c"AT", c"unix_ms", Kind::UnixTime)
    .summary(c"test clock: run as if the server's clock read unix_ms (needs quota.test-clock yes)");

/// Where a command's keys are (a Redis key spec).
#[derive(Debug)]
pub struct KeySpec {
    /// `REDISMODULE_CMD_KEY_*` bits: exactly one of RO, RW, OW, RM, plus ACCESS, UPDATE, ...
    pub flags: u32,
    pub begin: Begin,
    pub find: Find,
}

/// Where the search for a key spec's keys begins.
#[derive(Debug)]
pub enum Begin {
    /// At this argument index (1: the first after the command name).
    Index(c_int),
    /// After `keyword`, searched from argument `startfrom` (negative: from the end) — an
    /// option's key, e.g. `STREAM stream_key`.
    Keyword {
        keyword: &'static CStr,
        startfrom: c_int,
    },
}

/// How the keys continue from where [`KeySpec::begin`] found the first.
#[derive(Debug)]
pub enum Find {
    /// `lastkey` relative to the first (0: one key; -1: to the end), every `step`.
    Range { lastkey: c_int, step: c_int },
    /// The argument `keynumidx` after the beginning counts the keys, which start `firstkey`
    /// after it.
    Keynum {
        keynumidx: c_int,
        firstkey: c_int,
        step: c_int,
    },
}

const RO: u32 = raw::REDISMODULE_CMD_KEY_RO;
const RW: u32 = raw::REDISMODULE_CMD_KEY_RW;
const OW: u32 = raw::REDISMODULE_CMD_KEY_OW;
const ACCESS: u32 = raw::REDISMODULE_CMD_KEY_ACCESS;
const UPDATE: u32 = raw::REDISMODULE_CMD_KEY_UPDATE;

/// One key at position 1.
const fn key_at_1(flags: u32) -> KeySpec {
    KeySpec {
        flags,
        begin: Begin::Index(1),
        find: Find::Range {
            lastkey: 0,
            step: 1,
        },
    }
}

/// `numkeys key [key ...]` starting at position 1.
pub const fn numkeys_at_1(flags: u32) -> KeySpec {
    KeySpec {
        flags,
        begin: Begin::Index(1),
        find: Find::Keynum {
            keynumidx: 0,
            firstkey: 1,
            step: 1,
        },
    }
}

/// The documentation of one command.
#[derive(Debug)]
pub struct CommandDoc {
    /// As registered, upper case.
    pub name: &'static CStr,
    pub summary: &'static CStr,
    pub since: &'static CStr,
    pub complexity: &'static CStr,
    /// As in `COMMAND INFO`: `n` exactly, `-n` at least n, the command name included.
    pub arity: c_int,
    pub keys: &'static [KeySpec],
    pub args: &'static [Arg],
}

/// Every `QUOTA.*` command, in the order `QUOTA.HELP` lists them (internal ones last).
pub static COMMANDS: &[CommandDoc] = &[
    CommandDoc {
        name: c"QUOTA.SET",
        summary: c"Creates a budget, or changes its settings: limit, used, overdraft, largest reservation, default TTL, calendar period. With WINDOW: stores a window key's limit and window.",
        since: V0_1,
        complexity: c"O(1) to create. O(log N) to update, N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | UPDATE)],
        args: &[
            key(),
            Arg {
                token: Some(c"WINDOW"),
                optional: true,
                summary: Some(c"Stores a window key's configuration (no other option but NX, XX, AT); QUOTA.WINDOW key and the M* commands then use it."),
                only_with: &[c"key", c"condition", c"unix_ms"],
                ..block(c"window", &[
                    int(c"limit"),
                    int(c"window_ms"),
                    option(c"PRECISION", c"precision_ms", Kind::Integer),
                ])
            },
            option(c"LIMIT", c"limit", Kind::Integer).summary(c"the budget's limit (required to create it)"),
            option(c"USED", c"used", Kind::Integer).summary(c"sets what is used (a migration, a correction)"),
            option(c"OVERDRAFT", c"overdraft", Kind::Integer).summary(c"how far a settle or a forced charge may go past the limit"),
            option(c"MAXRESERVE", c"max_reserve", Kind::Integer).summary(c"the largest amount one call may reserve or charge; -1: no cap"),
            option(c"TTL", c"ttl_ms", Kind::Integer).summary(c"default reservation TTL"),
            one_of(Some(c"PERIOD"), c"period", &[
                word(c"NONE", c"none"),
                word(c"MINUTE", c"minute"),
                word(c"HOUR", c"hour"),
                word(c"DAY", c"day"),
                word(c"WEEK", c"week"),
                word(c"MONTH", c"month"),
            ])
            .summary(c"calendar period after which used restarts from 0"),
            option(c"TZ", c"zone", Kind::String).summary(c"IANA time zone of the period (default UTC)"),
            option(c"ANCHOR", c"anchor_ms", Kind::UnixTime).summary(c"a period start: periods follow it instead of the calendar"),
            one_of(Some(c"ONEXPIRE"), c"on_expire", &[
                word(c"RELEASE", c"release").summary(c"an expired reservation costs nothing (default)"),
                word(c"CHARGE", c"charge").summary(c"an expired reservation is charged its held amount"),
                word(c"ELAPSED", c"elapsed").summary(c"charged from its start to its last heartbeat, in UNIT"),
            ])
            .summary(c"what an expired, never-settled reservation is charged"),
            one_of(Some(c"UNIT"), c"unit", &[
                word(c"MS", c"ms"),
                word(c"S", c"s"),
                word(c"MIN", c"min"),
                word(c"NONE", c"none"),
            ])
            .summary(c"a time budget's unit: SETTLE key id ELAPSED and ONEXPIRE ELAPSED measure in it"),
            option(c"STREAM", c"stream_key", Kind::String).summary(c"the usage log: a Redis Stream getting one entry per charge (same slot in a cluster); empty: off"),
            option(c"STREAMMAXLEN", c"stream_maxlen", Kind::Integer).summary(c"trims the usage stream to about this many entries (default 1000000; 0: never)"),
            one_of(None, c"condition", &[
                word(c"NX", c"nx").summary(c"only create"),
                word(c"XX", c"xx").summary(c"only change an existing budget"),
            ]),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.INFO",
        summary: c"Returns a budget's state (limit, used, reserved, available, settings, period) or a window key's (limit, window, precision, counted, remaining, reset). Nil if there is none.",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds.",
        arity: -2,
        keys: &[key_at_1(RO | ACCESS)],
        args: &[key(), AT],
    },
    CommandDoc {
        name: c"QUOTA.RESERVE",
        summary: c"Reserves an amount before the work: granted with the reservation's id, or denied with retry_after_ms. Settle or roll back by id.",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | ACCESS | UPDATE)],
        args: &[
            key(),
            int(c"amount").summary(c"units to reserve"),
            option(c"ID", c"id", Kind::String).summary(c"the reservation's id (idempotent retries); generated if absent"),
            option(c"TTL", c"ttl_ms", Kind::Integer).summary(c"released unless settled or extended within ttl_ms (default: the budget's TTL)"),
            option(c"KEEP", c"keep", Kind::Integer).summary(c"grant only if at least keep stays available afterwards (headroom for calls without KEEP)"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.SETTLE",
        summary: c"Settles a reservation with the amount actually used; the rest returns to the budget.",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | ACCESS | UPDATE)],
        args: &[
            key(),
            string(c"id").summary(c"the reservation's id, as RESERVE returned it"),
            one_of(None, c"actual", &[
                int(c"actual").summary(c"units actually used"),
                word(c"ELAPSED", c"elapsed").summary(c"the time since the grant, in the budget's UNIT"),
            ])
            .required(),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.ROLLBACK",
        summary: c"Cancels a pending reservation: all of it returns to the budget.",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | ACCESS | UPDATE)],
        args: &[key(), string(c"id").summary(c"the reservation's id"), AT],
    },
    CommandDoc {
        name: c"QUOTA.EXTEND",
        summary: c"Moves a pending reservation's deadline to ttl_ms from now (a heartbeat for long work).",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | UPDATE)],
        args: &[
            key(),
            string(c"id").summary(c"the reservation's id"),
            int(c"ttl_ms").summary(c"new time left, ms"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.CHARGE",
        summary: c"Charges an amount in one step, without a reservation: charged, or denied with retry_after_ms.",
        since: V0_1,
        complexity: c"O(log N), N being the ids the key holds, plus the bounded cleanup of a write.",
        arity: -2,
        keys: &[key_at_1(RW | ACCESS | UPDATE)],
        args: &[
            key(),
            int(c"amount").summary(c"units to charge"),
            option(c"ID", c"id", Kind::String).summary(c"the charge's id (idempotent retries)"),
            flag(c"FORCE", c"force").summary(c"charge even past the limit (the excess counts as overrun)"),
            option(c"KEEP", c"keep", Kind::Integer).summary(c"grant only if at least keep stays available afterwards (headroom for calls without KEEP)"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.PENDING",
        summary: c"Lists a budget's pending reservations: id, amount, age_ms, ttl_ms, start_ms, heartbeat_ms.",
        since: V0_1,
        complexity: c"O((1 + COUNT) * log N), N being the ids the key holds.",
        arity: -2,
        keys: &[key_at_1(RO | ACCESS)],
        args: &[
            key(),
            option(c"COUNT", c"count", Kind::Integer).summary(c"at most count entries (default 100, at most 10000)"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.WINDOW",
        summary: c"Counts a call against a sliding-window rate limit of limit per window_ms (or the key's stored configuration): allowed or denied, remaining, retry_after_ms, reset_after_ms.",
        since: V0_1,
        complexity: c"O(log B) plus the buckets that left the window since the last call, B being the buckets held (at most 4097); O(B) at worst.",
        arity: -2,
        keys: &[key_at_1(RW | ACCESS | UPDATE)],
        args: &[
            key(),
            block(c"window", &[
                int(c"limit").summary(c"most units admitted per window"),
                int(c"window_ms").summary(c"the window's length, ms"),
            ])
            .optional()
            .summary(c"absent: the configuration QUOTA.SET key WINDOW stored"),
            option(c"COST", c"cost", Kind::Integer).summary(c"units this call counts (default 1)"),
            option(c"PRECISION", c"precision_ms", Kind::Integer).summary(c"bucket length, ms (default window_ms/60); with limit window_ms only"),
            flag(c"PEEK", c"peek").summary(c"decide without counting"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.MRESERVE",
        summary: c"Reserves on up to 16 budgets and configured windows at once, all or nothing: granted with one id for every key, or denied with the first key that did not fit and retry_after_ms.",
        since: V0_1,
        complexity: c"O(K * log N), K being the keys, N the ids a key holds, plus the bounded cleanup of each write.",
        arity: -2,
        keys: &[numkeys_at_1(RW | ACCESS | UPDATE)],
        args: &[
            int(c"numkeys").summary(c"how many keys follow (1 to 16)"),
            Arg::new(c"key", Kind::Key(0)).multiple(),
            int(c"amount").multiple().summary(c"one amount per key, in key order"),
            option(c"ID", c"id", Kind::String).summary(c"the reservation's id on every key; generated if absent"),
            option(c"TTL", c"ttl_ms", Kind::Integer).summary(c"released unless settled or extended within ttl_ms"),
            option(c"KEEP", c"keep", Kind::Integer).summary(c"on every budget key: grant only if at least keep stays available (windows ignore it)"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.MSETTLE",
        summary: c"Settles a reservation made by QUOTA.MRESERVE on each of its keys with the amount actually used.",
        since: V0_1,
        complexity: c"O(K * log N), K being the keys, N the ids a key holds.",
        arity: -2,
        keys: &[numkeys_at_1(RW | ACCESS | UPDATE)],
        args: &[
            int(c"numkeys"),
            Arg::new(c"key", Kind::Key(0)).multiple(),
            string(c"id"),
            one_of(None, c"actual", &[
                int(c"actual"),
                word(c"ELAPSED", c"elapsed").summary(c"a budget key's time since the grant, in its UNIT"),
            ])
            .required()
            .multiple()
            .summary(c"one amount per key, in key order"),
            AT,
        ],
    },
    CommandDoc {
        name: c"QUOTA.MROLLBACK",
        summary: c"Cancels a reservation made by QUOTA.MRESERVE on each of its keys.",
        since: V0_1,
        complexity: c"O(K * log N), K being the keys, N the ids a key holds.",
        arity: -2,
        keys: &[numkeys_at_1(RW | ACCESS | UPDATE)],
        args: &[int(c"numkeys"), Arg::new(c"key", Kind::Key(0)).multiple(), string(c"id"), AT],
    },
    CommandDoc {
        name: c"QUOTA.MEXTEND",
        summary: c"Moves the deadline of a reservation made by QUOTA.MRESERVE on each of its keys to ttl_ms from now.",
        since: V0_1,
        complexity: c"O(K * log N), K being the keys, N the ids a key holds.",
        arity: -2,
        keys: &[numkeys_at_1(RW | UPDATE)],
        args: &[int(c"numkeys"), Arg::new(c"key", Kind::Key(0)).multiple(), string(c"id"), int(c"ttl_ms"), AT],
    },
    CommandDoc {
        name: c"QUOTA.HELP",
        summary: c"Shows the syntax of every QUOTA command, one line per form.",
        since: V0_1,
        complexity: c"O(1)",
        arity: 1,
        keys: &[],
        args: &[],
    },
    CommandDoc {
        name: c"QUOTA.APPLY",
        summary: c"Internal, not for clients: applies a master's budget effects on a replica or while loading the AOF.",
        since: V0_1,
        complexity: c"O(E * log N), E being the effects, N the ids the key holds.",
        arity: -3,
        keys: &[key_at_1(RW | UPDATE)],
        args: &[
            key(),
            string(c"packed").summary(c"at_ms and the effects in one string (or the legacy form's at_ms)"),
            string(c"token").optional().multiple().summary(c"legacy form: the effects' tokens, one per argument"),
        ],
    },
    CommandDoc {
        name: c"QUOTA.WAPPLY",
        summary: c"Internal, not for clients: records a master's admitted QUOTA.WINDOW call on a replica or while loading the AOF.",
        since: V0_1,
        complexity: c"O(B), B being the buckets held.",
        arity: -3,
        keys: &[key_at_1(RW | UPDATE)],
        args: &[
            key(),
            string(c"packed").summary(c"at_ms window_ms precision_ms cost expire_at_ms in one string (or the legacy form's at_ms)"),
            string(c"token").optional().multiple().summary(c"legacy form: the other four integers"),
        ],
    },
    CommandDoc {
        name: c"QUOTA.MAPPLY",
        summary: c"Internal, not for clients: applies a master's multi-key write (every key's effects) on a replica or while loading the AOF.",
        since: V0_1,
        complexity: c"O(K * E * log N), K being the keys, E the effects per key, N the ids a key holds.",
        arity: -4,
        keys: &[numkeys_at_1(RW | UPDATE)],
        args: &[
            int(c"numkeys"),
            Arg::new(c"key", Kind::Key(0)).multiple(),
            string(c"packed").summary(c"per key: its kind (B or W) and its QUOTA.APPLY / QUOTA.WAPPLY line"),
        ],
    },
    CommandDoc {
        name: c"QUOTA.LOAD",
        summary: c"Internal, not for clients: replaces a key's value with a serialized state, as written by AOF rewrite.",
        since: V0_1,
        complexity: c"O(N), N being the size of the payload.",
        arity: -4,
        keys: &[key_at_1(OW | UPDATE)],
        args: &[
            key(),
            string(c"type").summary(c"rq-budget or rq-window (absent in the legacy form: a budget)"),
            int(c"encver").summary(c"the encoding version"),
            string(c"payload").summary(c"the value's RDB bytes"),
        ],
    },
];

/// The documentation of the command named `name` (case-insensitive), if it has one.
pub fn find(name: &[u8]) -> Option<&'static CommandDoc> {
    COMMANDS
        .iter()
        .find(|c| c.name.to_bytes().eq_ignore_ascii_case(name))
}

impl CommandDoc {
    /// Whether only the key specs say where the keys are (`numkeys`).
    pub fn needs_key_specs(&self) -> bool {
        self.keys
            .iter()
            .any(|k| matches!(k.find, Find::Keynum { .. }))
    }

    /// The command's syntax on one line, as error replies give it:
    /// `QUOTA.RESERVE key amount [ID id] [TTL ttl_ms] [KEEP keep] [AT unix_ms]`.
    /// A command with several forms ([`CommandDoc::forms`], `QUOTA.SET`'s budget and `WINDOW`
    /// forms) gives them all, joined by ` | `.
    pub fn usage(&self) -> String {
        let forms: Vec<String> = self.forms().into_iter().map(|(line, _)| line).collect();
        forms.join(" | ")
    }

    /// The command's forms, as `QUOTA.HELP` lists them: `(usage line, summary)`. One form (the
    /// [`CommandDoc::usage`] and the summary) unless an option makes a form of its own
    /// ([`Arg::only_with`]): then the form without it first (the command's summary), then one
    /// per such option, required, with only the arguments it takes (the option's summary).
    pub fn forms(&self) -> Vec<(String, &'static CStr)> {
        let own = |a: &Arg| !a.only_with.is_empty();
        let name = self.name.to_string_lossy().into_owned();
        let mut main = name.clone();
        for arg in self.args.iter().filter(|a| !own(a)) {
            main.push(' ');
            render(arg, &mut main);
        }
        let mut forms = vec![(main, self.summary)];
        for alone in self.args.iter().filter(|a| own(a)) {
            let mut line = name.clone();
            for arg in self.args {
                if std::ptr::eq(arg, alone) {
                    line.push(' ');
                    line.push_str(&arg.form());
                } else if alone.only_with.contains(&arg.name) {
                    line.push(' ');
                    render(arg, &mut line);
                }
            }
            forms.push((line, alone.summary.unwrap_or(self.summary)));
        }
        forms
    }

    /// The usage line of the form that the option `token` makes ([`CommandDoc::forms`]:
    /// `QUOTA.SET key WINDOW limit window_ms ...`), if it makes one.
    pub fn form_usage(&self, token: &CStr) -> Option<String> {
        let index = self
            .args
            .iter()
            .filter(|a| !a.only_with.is_empty())
            .position(|a| a.token == Some(token))?;
        self.forms()
            .into_iter()
            .nth(index.saturating_add(1))
            .map(|(line, _)| line)
    }

    /// The option of this command whose keyword is `token` (case-insensitive): a top-level
    /// `TOKEN value`, flag or tokened choice, or an alternative of an untokened choice (`NX`).
    pub fn option(&self, token: &[u8]) -> Option<&'static Arg> {
        find_option(self.args, token)
    }

    /// The positional argument at `index` (0: the first after the command name), if the
    /// arguments up to it are all untokened and single (so the position says which). The
    /// members of an untokened group (`[limit window_ms]`) count as positions.
    pub fn positional(&self, index: usize) -> Option<&'static Arg> {
        let mut at = 0usize;
        for arg in self.args {
            let group = arg.kind == Kind::Block && arg.token.is_none();
            let members: &'static [Arg] = if group {
                arg.subargs
            } else {
                std::slice::from_ref(arg)
            };
            for member in members {
                if member.token.is_some() || member.multiple || member.optional || arg.multiple {
                    return None;
                }
                if at == index {
                    return Some(member);
                }
                at = at.saturating_add(1);
            }
            if arg.optional && !group {
                return None;
            }
        }
        None
    }
}

/// The option of `args` whose keyword is `token` (case-insensitive): a top-level `TOKEN value`,
/// flag or tokened choice, an alternative of an untokened choice (`NX`), or an option inside a
/// group (`PRECISION` in `[WINDOW limit window_ms [PRECISION precision_ms]]`).
fn find_option(args: &'static [Arg], token: &[u8]) -> Option<&'static Arg> {
    args.iter().find_map(|a| {
        if a.token
            .is_some_and(|t| t.to_bytes().eq_ignore_ascii_case(token))
        {
            return Some(a);
        }
        match a.kind {
            Kind::OneOf if a.token.is_none() => find_option(a.subargs, token),
            Kind::Block => find_option(a.subargs, token),
            _ => None,
        }
    })
}

/// Appends `arg` as redis-cli and the Redis docs write it: `[TTL ttl_ms]`, `[NX|XX]`,
/// `key [key ...]`.
fn render(arg: &Arg, out: &mut String) {
    if arg.optional {
        out.push('[');
        out.push_str(&arg.form());
        out.push(']');
    } else {
        out.push_str(&arg.form());
    }
}

impl Arg {
    /// The argument as written, without the brackets of an optional one: `TTL ttl_ms`,
    /// `PERIOD NONE|MINUTE|...`, `key [key ...]`.
    pub fn form(&self) -> String {
        let mut body = String::new();
        if let Some(token) = self.token {
            body.push_str(&token.to_string_lossy());
        }
        match self.kind {
            Kind::PureToken => {}
            Kind::OneOf | Kind::Block => {
                if !body.is_empty() {
                    body.push(' ');
                }
                let sep = if self.kind == Kind::OneOf { "|" } else { " " };
                for (i, sub) in self.subargs.iter().enumerate() {
                    if i > 0 {
                        body.push_str(sep);
                    }
                    render(sub, &mut body);
                }
            }
            _ => {
                if !body.is_empty() {
                    body.push(' ');
                }
                body.push_str(&self.placeholder());
            }
        }
        if self.multiple {
            body = format!("{body} [{body} ...]");
        }
        body
    }
}

/// The first line of `QUOTA.HELP`: what every command's arguments start with.
pub const HELP_HEADER: &str = "QUOTA.<command> [<arg> ...]: a key first, numkeys key [key ...] \
     first for QUOTA.M*, nothing for QUOTA.HELP. Commands are:";

/// `QUOTA.HELP` → one simple string per form of each command ([`CommandDoc::forms`]): its
/// usage line and summary, after a header line, as `XINFO HELP` answers.
pub fn quota_help(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
    let mut lines = vec![RedisValue::SimpleStringStatic(HELP_HEADER)];
    for doc in COMMANDS {
        for (usage, summary) in doc.forms() {
            lines.push(RedisValue::SimpleString(format!(
                "{usage} -- {}",
                summary.to_string_lossy()
            )));
        }
    }
    Ok(RedisValue::Array(lines))
}

/// Sets every command's documentation. A server that refuses a command's info (or a command
/// not registered) is logged and skipped, as documentation must not stop the module from
/// loading (the tests check every command has it) — except where the info carries the only
/// description of the command's keys (a `numkeys` key spec, which the legacy key positions
/// cannot say): then cluster routing and ACL key checks would miss keys, so it is an error.
///
/// Redis takes a command's info once: a second `RedisModule_SetCommandInfo` on the same command
/// fails (EEXIST), so this is the only place that sets it.
pub fn set_all(ctx: &Context) -> Result<(), String> {
    // SAFETY: copies of pointers written once by RedisModule_Init.
    let (Some(get), Some(set)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Err("RedisModule_SetCommandInfo is not available".to_string());
    };
    for doc in COMMANDS {
        let name = doc.name.to_string_lossy();
        let refused = |what: &str| -> Result<(), String> {
            if doc.needs_key_specs() {
                return Err(format!("{what} {name}"));
            }
            ctx.log_warning(&format!(
                "quota: {what} {name} (continuing without its docs)"
            ));
            Ok(())
        };
        // SAFETY: the load context is live; the name is static and NUL-terminated.
        let command = unsafe { get(ctx.ctx, doc.name.as_ptr()) };
        if command.is_null() {
            refused("no registered command")?;
            continue;
        }
        let mut store = Vec::new();
        let args = c_args(doc.args, &mut store);
        let mut keys: Vec<raw::RedisModuleCommandKeySpec> =
            doc.keys.iter().map(c_key_spec).collect();
        keys.push(c_key_spec_end());
        let info = raw::RedisModuleCommandInfo {
            version: &INFO_VERSION,
            summary: doc.summary.as_ptr(),
            complexity: doc.complexity.as_ptr(),
            since: doc.since.as_ptr(),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: doc.arity,
            key_specs: if doc.keys.is_empty() {
                ptr::null_mut()
            } else {
                keys.as_mut_ptr()
            },
            args,
        };
        // SAFETY: a live command handle; `info` and everything it points to (static strings,
        // `keys`, the arrays in `store`) outlive the call, and Redis copies what it keeps.
        if unsafe { set(command, &info) } != raw::REDISMODULE_OK as c_int {
            refused("the server refused the command info (see the lines above) of")?;
        }
    }
    Ok(())
}

/// Version 1 of the info structs, with this build's struct sizes (Redis walks the arrays with
/// them, so a server that knows fewer fields reads only those).
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

fn opt_ptr(s: Option<&'static CStr>) -> *const std::os::raw::c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}

/// `args` as a C array ended by a zeroed entry; the arrays (this one and the subargs') are
/// kept in `store` until Redis has copied them.
fn c_args(
    args: &'static [Arg],
    store: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    if args.is_empty() {
        return ptr::null_mut();
    }
    let mut list: Vec<raw::RedisModuleCommandArg> =
        Vec::with_capacity(args.len().saturating_add(1));
    for a in args {
        let mut flags = raw::REDISMODULE_CMD_ARG_NONE;
        if a.optional {
            flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        }
        if a.multiple {
            flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        }
        let (type_, key_spec_index) = match a.kind {
            Kind::Key(i) => (raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY, i),
            Kind::Integer => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                -1,
            ),
            Kind::String => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                -1,
            ),
            Kind::UnixTime => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
                -1,
            ),
            Kind::PureToken => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                -1,
            ),
            Kind::OneOf => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                -1,
            ),
            Kind::Block => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                -1,
            ),
        };
        list.push(raw::RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_,
            key_spec_index,
            token: opt_ptr(a.token),
            summary: opt_ptr(a.summary),
            since: ptr::null(),
            flags: c_int::try_from(flags).unwrap_or(0),
            deprecated_since: ptr::null(),
            subargs: c_args(a.subargs, store),
            display_text: ptr::null(),
        });
    }
    list.push(raw::RedisModuleCommandArg {
        name: ptr::null(),
        type_: 0,
        key_spec_index: 0,
        token: ptr::null(),
        summary: ptr::null(),
        since: ptr::null(),
        flags: 0,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    });
    let head = list.as_mut_ptr();
    // Moving the Vec keeps its buffer where it is.
    store.push(list);
    head
}

fn c_key_spec(k: &KeySpec) -> raw::RedisModuleCommandKeySpec {
    let (find_keys_type, fk) = match k.find {
        Find::Range { lastkey, step } => (
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
            raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                    lastkey,
                    keystep: step,
                    limit: 0,
                },
            },
        ),
        Find::Keynum {
            keynumidx,
            firstkey,
            step,
        } => (
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
            raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                    keynumidx,
                    firstkey,
                    keystep: step,
                },
            },
        ),
    };
    let (begin_search_type, bs) = match k.begin {
        Begin::Index(pos) => (
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
            raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos },
            },
        ),
        Begin::Keyword { keyword, startfrom } => (
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_KEYWORD,
            raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                keyword: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_2 {
                    keyword: keyword.as_ptr(),
                    startfrom,
                },
            },
        ),
    };
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: u64::from(k.flags),
        begin_search_type,
        bs,
        find_keys_type,
        fk,
    }
}

/// The entry that ends a key spec array (begin search type 0).
fn c_key_spec_end() -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: 0,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 0 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 0,
                limit: 0,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_lines_read_as_the_docs_write_them() {
        let usage = |name: &str| find(name.as_bytes()).unwrap().usage();
        assert_eq!(
            usage("quota.reserve"),
            "QUOTA.RESERVE key amount [ID id] [TTL ttl_ms] [KEEP keep] [AT unix_ms]"
        );
        assert_eq!(
            usage("QUOTA.SET"),
            "QUOTA.SET key [LIMIT limit] [USED used] [OVERDRAFT overdraft] \
             [MAXRESERVE max_reserve] [TTL ttl_ms] [PERIOD NONE|MINUTE|HOUR|DAY|WEEK|MONTH] \
             [TZ zone] [ANCHOR anchor_ms] [ONEXPIRE RELEASE|CHARGE|ELAPSED] \
             [UNIT MS|S|MIN|NONE] [STREAM stream_key] [STREAMMAXLEN stream_maxlen] [NX|XX] \
             [AT unix_ms] | QUOTA.SET key WINDOW limit window_ms [PRECISION precision_ms] \
             [NX|XX] [AT unix_ms]"
        );
        assert_eq!(
            usage("QUOTA.APPLY"),
            "QUOTA.APPLY key packed [token [token ...]]"
        );
        assert_eq!(usage("QUOTA.HELP"), "QUOTA.HELP");
        assert_eq!(
            usage("QUOTA.WINDOW"),
            "QUOTA.WINDOW key [limit window_ms] [COST cost] [PRECISION precision_ms] [PEEK] \
             [AT unix_ms]"
        );
        assert_eq!(
            usage("QUOTA.MRESERVE"),
            "QUOTA.MRESERVE numkeys key [key ...] amount [amount ...] [ID id] [TTL ttl_ms] \
             [KEEP keep] [AT unix_ms]"
        );
    }

    #[test]
    fn help_shows_quota_set_as_its_two_forms() {
        let forms = find(b"QUOTA.SET").unwrap().forms();
        let usages: Vec<&str> = forms.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(
            usages,
            [
                "QUOTA.SET key [LIMIT limit] [USED used] [OVERDRAFT overdraft] \
                 [MAXRESERVE max_reserve] [TTL ttl_ms] [PERIOD NONE|MINUTE|HOUR|DAY|WEEK|MONTH] \
                 [TZ zone] [ANCHOR anchor_ms] [ONEXPIRE RELEASE|CHARGE|ELAPSED] \
                 [UNIT MS|S|MIN|NONE] [STREAM stream_key] [STREAMMAXLEN stream_maxlen] [NX|XX] \
                 [AT unix_ms]",
                "QUOTA.SET key WINDOW limit window_ms [PRECISION precision_ms] [NX|XX] \
                 [AT unix_ms]",
            ]
        );
        assert!(forms[1]
            .1
            .to_str()
            .unwrap()
            .starts_with("Stores a window key's"));
        let set = find(b"QUOTA.SET").unwrap();
        assert_eq!(set.form_usage(c"WINDOW").as_deref(), Some(usages[1]));
        assert_eq!(set.form_usage(c"LIMIT"), None);
        // Every other command has one form: its usage line.
        for c in COMMANDS.iter().filter(|c| c.name != c"QUOTA.SET") {
            assert_eq!(c.forms(), vec![(c.usage(), c.summary)]);
        }
    }

    #[test]
    fn options_and_positions_are_found() {
        let set = find(b"QUOTA.SET").unwrap();
        assert_eq!(set.option(b"limit").unwrap().name, c"limit");
        assert_eq!(set.option(b"xx").unwrap().name, c"xx");
        assert_eq!(set.option(b"period").unwrap().name, c"period");
        assert!(set.option(b"DAY").is_none());
        assert!(set.option(b"key").is_none());
        assert_eq!(set.positional(0).unwrap().name, c"key");
        assert!(set.positional(1).is_none());
        assert_eq!(set.option(b"precision").unwrap().name, c"precision_ms");
        let window = find(b"QUOTA.WINDOW").unwrap();
        assert_eq!(window.positional(1).unwrap().name, c"limit");
        assert_eq!(window.positional(2).unwrap().name, c"window_ms");
        assert!(window.positional(3).is_none());
        let mreserve = find(b"QUOTA.MRESERVE").unwrap();
        assert_eq!(mreserve.positional(0).unwrap().name, c"numkeys");
        assert!(mreserve.positional(1).is_none());
        assert!(mreserve.needs_key_specs() && !set.needs_key_specs());
        let reserve = find(b"QUOTA.RESERVE").unwrap();
        assert_eq!(reserve.positional(1).unwrap().name, c"amount");
        assert!(reserve.positional(2).is_none());
    }

    /// The shapes Redis validates (it refuses the whole info otherwise).
    #[test]
    fn every_entry_is_well_formed() {
        fn check(cmd: &str, args: &[Arg], keys: usize) {
            for a in args {
                let what = format!("{cmd} {:?}", a.name);
                match a.kind {
                    Kind::Key(i) => assert!(usize::try_from(i).unwrap() < keys, "{what}"),
                    Kind::PureToken => assert!(a.token.is_some(), "{what}"),
                    _ => {}
                }
                let compound = matches!(a.kind, Kind::OneOf | Kind::Block);
                assert_eq!(compound, !a.subargs.is_empty(), "{what}");
                check(cmd, a.subargs, keys);
            }
        }
        for (i, c) in COMMANDS.iter().enumerate() {
            let name = c.name.to_str().unwrap();
            assert!(name.starts_with("QUOTA."), "{name}");
            assert!(
                COMMANDS[..i].iter().all(|o| o.name != c.name),
                "{name} twice"
            );
            assert!(!c.summary.is_empty() && !c.complexity.is_empty(), "{name}");
            check(name, c.args, c.keys.len());
            let internal = c.summary.to_str().unwrap().starts_with("Internal");
            assert_eq!(
                internal,
                ["QUOTA.APPLY", "QUOTA.WAPPLY", "QUOTA.MAPPLY", "QUOTA.LOAD"].contains(&name),
                "{name}"
            );
        }
    }
}
