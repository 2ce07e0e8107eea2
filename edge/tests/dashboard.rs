//! The dashboard's answers that come before any database call, through `app()` with `oneshot`:
//! its headers, the redirect of a request without a session, and the refusals of a cross-site
//! or token-less form post (no socket, no database).

mod common;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use querylayer_edge::config::ServeArgs;
use querylayer_edge::{app, AppState};
use tower::ServiceExt;

fn state() -> AppState {
    common::state_of(ServeArgs { max_body_bytes: 4096, require_auth: false, ..common::serve_args() })
}

async fn body(response: axum::response::Response) -> String {
    String::from_utf8(to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn every_page_forbids_framing_and_inline_script_and_is_never_cached() {
    for path in ["/sign-in", "/docs", "/docs/dashboard", "/invite"] {
        let request =
            Request::get(path).header(header::HOST, "edge.example.com").body(Body::empty()).unwrap();
        let response = app(state()).oneshot(request).await.unwrap();
        let h = response.headers();
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{path}");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}");
        assert_eq!(h[header::CACHE_CONTROL], "no-store", "{path}");
        assert_eq!(h[header::REFERRER_POLICY], "same-origin", "{path}");
    }
    let page = app(state())
        .oneshot(
            Request::get("/sign-in").header(header::HOST, "edge.example.com").body(Body::empty()).unwrap(),
        )
        .await
        .unwrap();
    let html = body(page).await;
    assert!(html.contains("<html lang=\"en\">") && html.contains("autocomplete=\"current-password\""));
    assert!(!html.contains("<script>"), "no inline script");
}

#[tokio::test]
async fn a_page_without_a_session_redirects_to_sign_in() {
    // Under an https public URL the cookie is __Host-ql_session; a plain ql_session is ignored.
    let request = Request::get("/inbox")
        .header(header::HOST, "edge.example.com")
        .header(header::COOKIE, "ql_session=qls_planted")
        .body(Body::empty())
        .unwrap();
    let response = app(state()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[header::LOCATION], "/sign-in");
    let cleared = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("__Host-ql_session=; Max-Age=0;") && cleared.ends_with("Secure"),
        "{cleared}"
    );
}

#[tokio::test]
async fn a_cross_site_or_token_less_form_post_is_refused_before_the_database() {
    let cookie = format!("__Host-ql_session=qls_{}", "a".repeat(43));
    let post = |origin: &str, form: &'static str| {
        Request::post("/connections")
            .header(header::HOST, "edge.example.com")
            .header(header::ORIGIN, origin)
            .header(header::COOKIE, cookie.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form))
            .unwrap()
    };
    // An origin the edge accepts for its API, but not the dashboard's own.
    let foreign = app(state())
        .oneshot(post("https://console.example.com", "agent=a&name=x&csrf_token=t"))
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    assert!(body(foreign).await.contains("request from another site was refused"));
    let tokenless = app(state()).oneshot(post("https://edge.example.com", "agent=a&name=x")).await.unwrap();
    assert_eq!(tokenless.status(), StatusCode::FORBIDDEN);
    assert!(body(tokenless).await.contains("the form carried no CSRF token"));
}

#[tokio::test]
async fn assets_are_served_and_the_delivery_api_checks_its_query_first() {
    let css = app(state())
        .oneshot(
            Request::get("/assets/app.css")
                .header(header::HOST, "edge.example.com")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(css.status(), StatusCode::OK);
    assert_eq!(css.headers()[header::CONTENT_TYPE], "text/css; charset=utf-8");
    let bad = app(state())
        .oneshot(
            Request::get("/delivery/v1/sites/demo/content?draft=1")
                .header(header::HOST, "edge.example.com")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}
