//! The admission server's side of a drain. After SIGTERM a replica keeps answering for
//! `--drain-delay` while the endpoints catch up, but the API server keeps sending on the
//! keep-alive connections it already holds (it calls webhooks over HTTP/1.1, and a connection in
//! use is never idle). Each answer given while draining therefore closes its connection
//! (`Connection: close`): the API server's next call opens a new one, which the Service sends to a
//! ready replica. When the drain ends, no connection the API server is using is left to be closed
//! under a request (an `EOF` it would not retry). HTTP/2 has no per-answer close and actix-http
//! sends no GOAWAY: an HTTP/2 client keeps its connection until the server stops (README,
//! "Upgrade").

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::ConnectionType;
use futures::TryFutureExt;
use futures::future::{Either, MapOk};

use crate::state::Draining;

type Closing<F, B> = MapOk<F, fn(ServiceResponse<B>) -> ServiceResponse<B>>;

/// Middleware (`wrap_fn`, over the process's flag): while the replica drains, the answer closes
/// its connection.
pub fn close_when_draining<S, B>(
    draining: &Draining,
    req: ServiceRequest,
    service: &S,
) -> Either<Closing<S::Future, B>, S::Future>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    let answer = service.call(req);
    match draining.started() {
        true => Either::Left(answer.map_ok(close as fn(_) -> _)),
        false => Either::Right(answer),
    }
}

fn close<B>(mut answer: ServiceResponse<B>) -> ServiceResponse<B> {
    answer
        .response_mut()
        .head_mut()
        .set_connection_type(ConnectionType::Close);
    answer
}
