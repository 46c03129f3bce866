//! A kube client layer for tests that must act around the client's own requests: hold them to
//! count how many are in flight, or slip a write in between a read and the write made from it.

use std::sync::Arc;

use futures::future::BoxFuture;

/// What to run around one request: `before` it is sent, `after` its answer arrived (and before
/// the caller sees it).
#[derive(Default)]
pub struct Hooks {
    pub before: Option<BoxFuture<'static, ()>>,
    pub after: Option<BoxFuture<'static, ()>>,
}

type Choose = Arc<dyn Fn(&http::Method, &str) -> Hooks + Send + Sync>;

/// A layer that asks `choose` (given each request's method and path) what to run around it.
pub struct Around(Choose);

impl Around {
    pub fn new(choose: impl Fn(&http::Method, &str) -> Hooks + Send + Sync + 'static) -> Self {
        Self(Arc::new(choose))
    }
}

impl<S> tower::Layer<S> for Around {
    type Service = AroundService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AroundService {
            inner,
            choose: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AroundService<S> {
    inner: S,
    choose: Choose,
}

impl<S, B> tower::Service<http::Request<B>> for AroundService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send,
    S::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let hooks = (self.choose)(request.method(), request.uri().path());
        let answer = self.inner.call(request);
        Box::pin(async move {
            if let Some(before) = hooks.before {
                before.await;
            }
            let answered = answer.await;
            if let Some(after) = hooks.after {
                after.await;
            }
            answered
        })
    }
}
