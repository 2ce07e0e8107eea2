//! The HTTP stages that answer before any database call, driven through `app()` with `oneshot`
//! (no socket, no database: the pool is never asked for a connection on these paths).

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use querylayer_edge::{app, AppState};
use serde_json::Value;
use tower::ServiceExt;

fn state() -> AppState {
    common::state_of(common::serve_args())
}

fn mcp_post(host: &str) -> axum::http::request::Builder {
    Request::post("/mcp")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
}

async fn json(response: axum::response::Response) -> Value {
    serde_json::from_slice(&to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap()
}

const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

#[tokio::test]
async fn a_request_without_a_secret_gets_the_401_challenge_and_no_detail() {
    let response =
        app(state()).oneshot(mcp_post("localhost:8080").body(Body::from(TOOLS_LIST)).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        r#"Bearer resource_metadata="https://edge.example.com/.well-known/oauth-protected-resource""#
    );
    let body = json(response).await;
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert_eq!(body["error"]["message"], "authentication failed");
}

#[tokio::test]
async fn a_foreign_host_is_refused_before_authentication() {
    let response = app(state())
        .oneshot(mcp_post("evil.example.com").body(Body::from(TOOLS_LIST)).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(json(response).await["error"]["code"], "forbidden_host");
}

#[tokio::test]
async fn a_foreign_origin_is_refused_before_authentication() {
    let request =
        mcp_post("localhost").header(header::ORIGIN, "http://evil.example.com").body(Body::from(TOOLS_LIST));
    let response = app(state()).oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(json(response).await["error"]["code"], "forbidden_origin");
}

#[tokio::test]
async fn the_public_host_and_a_configured_origin_pass_the_guard() {
    let request = mcp_post("edge.example.com")
        .header(header::ORIGIN, "https://console.example.com")
        .body(Body::from(TOOLS_LIST));
    let response = app(state()).oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "the guard passes; authentication answers");
}

#[tokio::test]
async fn the_console_answers_401_without_a_member_token() {
    let request =
        Request::get("/api/console/proposals").header(header::HOST, "localhost").body(Body::empty());
    let response = app(state()).oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers()[header::WWW_AUTHENTICATE].to_str().unwrap().starts_with("Bearer"));
}

#[tokio::test]
async fn an_oversized_body_is_refused() {
    let request =
        mcp_post("localhost").header(header::CONTENT_LENGTH, 4096).body(Body::from(vec![b' '; 4096]));
    let response = app(state()).oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = json(response).await;
    assert_eq!(
        (body["error"]["code"].as_i64(), body["error"]["data"]["code"].as_str()),
        (Some(-32600), Some("payload_too_large"))
    );
}

#[tokio::test]
async fn resource_metadata_names_the_mcp_endpoint() {
    let request = Request::get("/.well-known/oauth-protected-resource").body(Body::empty());
    let body = json(app(state()).oneshot(request.unwrap()).await.unwrap()).await;
    assert_eq!(body["resource"], "https://edge.example.com/mcp");
    assert_eq!(body["bearer_methods_supported"][0], "header");
}

#[tokio::test]
async fn health_answers_without_the_database_and_unknown_paths_are_json_404() {
    let response = app(state()).oneshot(Request::get("/healthz").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = app(state()).oneshot(Request::get("/nowhere").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(json(response).await["error"]["code"], "not_found");
}

#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413_with_the_json_error() {
    // No Content-Length: the limit is only found while reading.
    let chunks = futures_chunks(8, 512);
    let request = Request::post("/api/console/form-screening")
        .header(header::HOST, "localhost")
        .header(header::AUTHORIZATION, "Bearer qlm_whatever")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(chunks));
    let response = app(state()).oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(response).await["error"]["code"], "payload_too_large");
}

fn futures_chunks(
    n: usize,
    size: usize,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_util::stream::iter((0..n).map(move |_| Ok(vec![b' '; size])))
}
