//! Which shared connection a query goes to: a pure function over snapshots
//! of the connections, so that it can be tested without a server.
//!
//! [`Routing::Fill`](crate::Routing::Fill) takes the first (oldest)
//! connection with room, so that later ones drain and go back to idle;
//! [`Routing::Spread`](crate::Routing::Spread) the least loaded. With
//! head-of-line awareness on (see [`costs`](super::costs)), fast queries
//! first avoid connections held up by slow work; slow queries go where there
//! is the least of it (with Fill, the newest such connection, keeping the
//! oldest clear). Between held-up connections, the one stuck longest is
//! likely the first to be free.
//!
//! The router ([`admission`](super::admission)) takes the snapshots, asks
//! [`survey`] and [`decide`], and claims the place with a compare-and-swap;
//! losing that race means looking again.

/// One shared connection as the router sees it for one decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Queries admitted and not finished.
    pub(crate) in_flight: u64,
    /// Takes no new work (retiring, quarantined, dead).
    pub(crate) closed: bool,
    /// Reads and drops an answer over the result caps: a query put behind
    /// it would wait for the whole answer, so it has no room meanwhile.
    pub(crate) draining: bool,
    /// Slow queries in flight on it.
    pub(crate) slow: u64,
    /// It owes answers and has read none for longer than a healthy pipeline
    /// takes: something slow that was not known to be is at its head.
    pub(crate) overdue: bool,
    /// When it last read an answer (nanoseconds on the pool's fine clock).
    pub(crate) last_ready: u64,
}

/// The settings one decision follows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    pub(crate) max_depth: u64,
    /// [`Routing::Fill`](crate::Routing::Fill), else Spread.
    pub(crate) fill: bool,
    /// Head-of-line awareness is on.
    pub(crate) hol: bool,
}

/// How a connection ranks for one query; lower is better, compared field by
/// field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    /// For a fast query, whether the connection is held up; for a slow one,
    /// how many slow queries it carries.
    primary: u64,
    /// For a fast query, how many slow queries it carries; for a slow one,
    /// whether it is overdue.
    secondary: u64,
    /// Its load with Spread (0 with Fill, so the first wins); between
    /// held-up connections, when each last made progress.
    tiebreak: u64,
    /// The connection is held up: better to open another, if there is room.
    held: bool,
}

impl Rank {
    fn of(c: &Candidate, slow: bool, rules: Rules) -> Rank {
        let load = if rules.fill { 0 } else { c.in_flight };
        if !rules.hol {
            return Rank {
                primary: 0,
                secondary: 0,
                tiebreak: load,
                held: false,
            };
        }
        if slow {
            return Rank {
                primary: c.slow,
                secondary: u64::from(c.overdue),
                tiebreak: load,
                held: c.slow > 0,
            };
        }
        let held = c.slow > 0 || c.overdue;
        Rank {
            primary: u64::from(held),
            secondary: c.slow,
            tiebreak: if held { c.last_ready } else { load },
            held,
        }
    }
}

/// What one pass over the connections found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Survey {
    /// The best connection with room (its index) and how it ranks.
    pub(crate) best: Option<(usize, Rank)>,
    /// Connections with room.
    pub(crate) with_room: usize,
    /// Connections open to new work.
    pub(crate) live: usize,
    /// Some connection is closed and should be pruned from the list.
    pub(crate) stale: bool,
    /// Queries in flight on all of them.
    pub(crate) in_flight: u64,
}

/// Ranks every candidate for one query.
#[inline]
pub(crate) fn survey(
    candidates: impl IntoIterator<Item = Candidate>,
    slow: bool,
    rules: Rules,
) -> Survey {
    let mut survey = Survey::default();
    for (index, c) in candidates.into_iter().enumerate() {
        survey.in_flight += c.in_flight;
        if c.closed {
            survey.stale = true;
            continue;
        }
        survey.live += 1;
        if c.in_flight >= rules.max_depth || c.draining {
            continue;
        }
        survey.with_room += 1;
        let rank = Rank::of(&c, slow, rules);
        let better = match survey.best {
            None => true,
            // Slow queries with Fill: the newest of equals.
            Some((_, best)) if slow && rules.fill => rank <= best,
            Some((_, best)) => rank < best,
        };
        if better {
            survey.best = Some((index, rank));
        }
    }
    survey
}

/// What to do with a query, given a survey and whether another connection
/// may be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Claim a place on the connection at this index.
    Go(usize),
    /// Nothing (good) has room, and a new connection may be opened.
    Open,
    /// Nothing has room: wait.
    Wait,
}

pub(crate) fn decide(survey: &Survey, room_to_open: bool) -> Decision {
    match survey.best {
        None if room_to_open => Decision::Open,
        None => Decision::Wait,
        // Better to wait for a new connection (a few round trips) than
        // behind a slow query of unknown length.
        Some((_, rank)) if rank.held && room_to_open => Decision::Open,
        Some((index, _)) => Decision::Go(index),
    }
}

/// After a place was claimed with `ahead` queries in front of it: whether to
/// open another connection for the queries to come. With Fill, when the
/// last connection with room just filled up; with Spread, whenever the
/// chosen one was busy.
pub(crate) fn open_another(rules: Rules, survey: &Survey, ahead: u64, room_to_open: bool) -> bool {
    let busy = if rules.fill {
        survey.with_room == 1 && ahead + 1 >= rules.max_depth
    } else {
        ahead > 0
    };
    busy && room_to_open
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILL: Rules = Rules {
        max_depth: 4,
        fill: true,
        hol: true,
    };
    const SPREAD: Rules = Rules {
        fill: false,
        ..FILL
    };

    fn with(in_flight: u64) -> Candidate {
        Candidate {
            in_flight,
            ..Candidate::default()
        }
    }

    fn pick(candidates: &[Candidate], slow: bool, rules: Rules) -> Decision {
        decide(&survey(candidates.iter().copied(), slow, rules), false)
    }

    #[test]
    fn fill_takes_the_first_connection_with_room() {
        let conns = [with(4), with(3), with(0)];
        assert_eq!(pick(&conns, false, FILL), Decision::Go(1));
    }

    #[test]
    fn spread_takes_the_least_loaded() {
        let conns = [with(2), with(3), with(1), with(1)];
        assert_eq!(pick(&conns, false, SPREAD), Decision::Go(2));
    }

    #[test]
    fn closed_and_full_connections_are_skipped_and_counted() {
        let closed = Candidate {
            closed: true,
            ..with(1)
        };
        let s = survey([closed, with(4), with(2)], false, FILL);
        assert_eq!(s.best.map(|(i, _)| i), Some(2));
        assert!(s.stale);
        assert_eq!((s.live, s.with_room, s.in_flight), (2, 1, 7));
    }

    #[test]
    fn a_draining_connection_has_no_room() {
        let draining = Candidate {
            draining: true,
            ..with(1)
        };
        let s = survey([draining, with(2)], false, FILL);
        assert_eq!(s.best.map(|(i, _)| i), Some(1));
        assert_eq!(
            decide(&survey([draining], false, FILL), true),
            Decision::Open
        );
    }

    #[test]
    fn nothing_with_room_opens_or_waits() {
        let full = [with(4), with(4)];
        let s = survey(full, false, FILL);
        assert_eq!(decide(&s, true), Decision::Open);
        assert_eq!(decide(&s, false), Decision::Wait);
        assert_eq!(decide(&survey([], false, FILL), true), Decision::Open);
    }

    #[test]
    fn fast_queries_avoid_held_up_connections() {
        let slow_one = Candidate { slow: 1, ..with(1) };
        let overdue = Candidate {
            overdue: true,
            ..with(1)
        };
        let conns = [slow_one, overdue, with(3)];
        assert_eq!(pick(&conns, false, FILL), Decision::Go(2));
    }

    #[test]
    fn among_held_up_connections_the_one_stuck_longest_wins() {
        let held = |last_ready, slow| Candidate {
            slow,
            last_ready,
            overdue: slow == 0,
            ..with(1)
        };
        // All held up, none with slow queries: the earliest progress wins.
        let conns = [held(300, 0), held(100, 0), held(200, 0)];
        assert_eq!(pick(&conns, false, FILL), Decision::Go(1));
        // Fewer slow queries ranks before earlier progress.
        let conns = [held(100, 2), held(300, 1)];
        assert_eq!(pick(&conns, false, SPREAD), Decision::Go(1));
    }

    #[test]
    fn a_held_up_best_choice_opens_another_connection_when_it_can() {
        let conns = [Candidate { slow: 1, ..with(1) }];
        let s = survey(conns, false, FILL);
        assert_eq!(decide(&s, true), Decision::Open);
        assert_eq!(decide(&s, false), Decision::Go(0), "else it still goes");
    }

    #[test]
    fn slow_queries_go_where_the_least_slow_work_is_newest_first_with_fill() {
        let slow = |n| Candidate { slow: n, ..with(1) };
        let conns = [slow(1), with(2), with(3), slow(2)];
        assert_eq!(pick(&conns, true, FILL), Decision::Go(2));
        assert_eq!(pick(&conns, true, SPREAD), Decision::Go(1));
    }

    #[test]
    fn without_head_of_line_awareness_only_the_load_counts() {
        let rules = Rules { hol: false, ..FILL };
        let slow_one = Candidate {
            slow: 3,
            overdue: true,
            ..with(1)
        };
        let s = survey([slow_one, with(0)], false, rules);
        assert_eq!(decide(&s, true), Decision::Go(0));
    }

    #[test]
    fn opening_another_follows_the_routing() {
        let s = survey([with(3)], false, FILL);
        assert!(open_another(FILL, &s, 3, true), "fill: the last place went");
        assert!(!open_another(FILL, &s, 2, true));
        assert!(!open_another(FILL, &s, 3, false), "no room to open");
        let s = survey([with(1), with(0)], false, SPREAD);
        assert!(open_another(SPREAD, &s, 1, true), "spread: it was busy");
        assert!(!open_another(SPREAD, &s, 0, true));
    }
}
