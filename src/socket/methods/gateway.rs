//! `clients.*` on the daemon socket (issue 12): the operator's pairing
//! and paired devices, for `omniconfluxd pair` and `omniconfluxd clients`,
//! when the node runs the gateway role. Operator only: an agent must not
//! pair a device. The gateway thread answers; the answer comes back
//! through the reactor's inbox. Without the gateway role: `unavailable`.

use serde_json::{Map, Value};

use super::require_operator;
use crate::daemon::{Daemon, Req};
use crate::errors::{Code, RpcError};
use crate::gateway::GwError;

pub fn dispatch(d: &mut Daemon, req: Req, method: &str, p: Map<String, Value>) {
    if let Err(e) = require_operator(&req) {
        return d.answer(req, Err(e));
    }
    let Some(gw) = &d.gateway else {
        return d.answer(
            req,
            Err(RpcError::new(
                Code::Unavailable,
                "the gateway role is not running; set [gateway] listen or run serve --gateway ADDR",
            )),
        );
    };
    let inbox = d.inbox.clone();
    gw.caller().call(
        method,
        Value::Object(p),
        Box::new(move |r| {
            inbox.run(move |d| d.answer(req, r.map_err(to_rpc)));
        }),
    );
}

/// The gateway's error as the socket's: the same message, the socket's code.
fn to_rpc(e: GwError) -> RpcError {
    let code = match e.code {
        "invalid-params" => Code::InvalidParams,
        "not-found" => Code::NotFound,
        "busy" => Code::Busy,
        "method-not-found" => Code::MethodNotFound,
        _ => Code::InternalError,
    };
    RpcError::new(code, e.message)
}
