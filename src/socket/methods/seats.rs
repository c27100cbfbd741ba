//! The daemon socket's seat methods (issue 3, Seats).
//!
//! | method      | who      | answers                                      |
//! |-------------|----------|----------------------------------------------|
//! | seats.list  | anyone   | {seats, agent_isolation}                     |
//! | seats.probe | operator | null; seats detected (when on), probed again |

use serde_json::{Map, Value, json};

use super::{Handled, NoParams, params, require_operator};
use crate::daemon::{Daemon, Req};
use crate::socket::views;

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    let result = match method {
        "seats.list" => seats_list(d, p),
        "seats.probe" => seats_probe(d, &req, p),
        other => Err(super::unknown_method(other)),
    };
    super::finish(d, req, result);
}

fn seats_list(d: &mut Daemon, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    let seats: Vec<Value> = d.core.seats.list.iter().map(views::seat).collect();
    Ok(Some(json!({
        "seats": seats,
        "agent_isolation": d.core.sessions.sandbox(d.cfg.agents.isolation()).to_json(),
    })))
}

fn seats_probe(d: &mut Daemon, req: &Req, p: Map<String, Value>) -> Handled {
    let NoParams {} = params(p)?;
    require_operator(req)?;
    crate::daemon::router::seats(d, crate::core::seats::Seats::probe);
    Ok(Some(Value::Null))
}
