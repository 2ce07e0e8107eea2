-- The reviewer's desk: what the web dashboard needs beyond the console API. Members sign in with
-- a password that a one-time invitation let them set (one password per member and site, stored
-- only as an argon2id hash, computed and checked by the extension: extension/src/sessions.rs);
-- a sign-in opens a server-side session (a row here, its cookie secret stored like any
-- credential: prefix plus SHA-256). Then the readings and decisions of the dashboard pages: the
-- inbox by risk, content by state, runs by outcome and agent, agents' scopes, the audit trail and
-- the ledger's verification, member sessions and invitations.

-- -------------------------------------------------------------------------------------------
-- Invitations: one-time links an operator or a site owner/admin issues to one member of one
-- site. Redeeming one sets that member's password for that site; the link then is spent.

CREATE TABLE querylayer.member_invitations (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    used_at         timestamptz,
    revoked_at      timestamptz,
    revoked_reason  text,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.member_invitations'::regclass);
CREATE INDEX member_invitations_member ON querylayer.member_invitations (site_id, member_id);

-- An invitation is used once or revoked once; nothing else about it changes.
CREATE FUNCTION querylayer.member_invitations_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'invitations are never deleted; revoke them' USING ERRCODE = 'QL423';
    END IF;
    IF OLD.used_at IS NOT NULL OR OLD.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'this invitation is already % ', CASE WHEN OLD.used_at IS NOT NULL THEN 'used' ELSE 'revoked' END
            USING ERRCODE = 'QL409';
    END IF;
    IF (to_jsonb(NEW) - 'used_at' - 'revoked_at' - 'revoked_reason')
       IS DISTINCT FROM (to_jsonb(OLD) - 'used_at' - 'revoked_at' - 'revoked_reason')
       OR (NEW.used_at IS NULL AND NEW.revoked_at IS NULL) THEN
        RAISE EXCEPTION 'only using or revoking may change an invitation' USING ERRCODE = 'QL423';
    END IF;
    RETURN NEW;
END
$$;
SELECT querylayer.guard_rows('querylayer.member_invitations'::regclass, 'querylayer.member_invitations_guard'::regproc, false);

-- -------------------------------------------------------------------------------------------
-- Passwords: one per member and site (a password opens exactly the site whose invitation set it,
-- so an admin of one site can never set a password that opens another). The row is found at
-- sign-in by the SHA-256 of the site slug and member handle the person typed, visible only
-- while the extension resolves exactly that pair (like a credential's fingerprint).

CREATE TABLE querylayer.member_passwords (
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    lookup_sha256   bytea NOT NULL UNIQUE CHECK (length(lookup_sha256) = 32),
    password_hash   text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    set_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    invitation_id   uuid NOT NULL REFERENCES querylayer.member_invitations ON DELETE RESTRICT,
    PRIMARY KEY (site_id, member_id)
);
SELECT querylayer.isolate_by_site('querylayer.member_passwords'::regclass);
CREATE POLICY sign_in_lookup ON querylayer.member_passwords FOR SELECT
    USING (lookup_sha256 = querylayer.ctx_presented_fingerprint());

-- Sign-in attempts per member and site, for the lockout that holds across every edge: after
-- five failures within fifteen minutes a member's password is not even checked until the
-- window has passed. Old rows are pruned at each sign-in of that member.
CREATE TABLE querylayer.sign_in_attempts (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site_id   uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    member_id uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    succeeded boolean NOT NULL
);
SELECT querylayer.isolate_by_site('querylayer.sign_in_attempts'::regclass);
CREATE INDEX sign_in_attempts_member ON querylayer.sign_in_attempts (site_id, member_id, at);

-- -------------------------------------------------------------------------------------------
-- Sessions: a signed-in member on one site. Expiring (twelve hours), revocable; the cookie
-- carries a secret (qls_…) whose SHA-256 is in querylayer.credentials.

CREATE TABLE querylayer.member_sessions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    site_id         uuid NOT NULL REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid NOT NULL REFERENCES querylayer.organizations ON DELETE RESTRICT,
    member_id       uuid NOT NULL REFERENCES querylayer.members ON DELETE RESTRICT,
    prefix          text NOT NULL,
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    CHECK (expires_at > created_at)
);
SELECT querylayer.isolate_by_site('querylayer.member_sessions'::regclass);
CREATE INDEX member_sessions_member ON querylayer.member_sessions (site_id, member_id);
SELECT querylayer.guard_rows('querylayer.member_sessions'::regclass, 'querylayer.credential_rows_guard'::regproc, false);
INSERT INTO querylayer.value_limits (table_name, column_name, argument, max_bytes) VALUES
    ('member_sessions', 'revoked_reason', 'reason', 1000);
SELECT querylayer.limit_values('querylayer.member_sessions'::regclass, true);

-- Called by the extension while it resolves a session cookie (that session's site only).
CREATE FUNCTION querylayer.resolve_member_session(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT t.*, s.slug AS site_slug, s.name AS site_name, o.slug AS organization_slug, m.handle AS member_handle,
           m.display_name, sm.role
      INTO r
      FROM querylayer.member_sessions t
      JOIN querylayer.sites s ON s.id = t.site_id
      JOIN querylayer.organizations o ON o.id = t.organization_id
      JOIN querylayer.members m ON m.id = t.member_id
      LEFT JOIN querylayer.site_members sm ON sm.site_id = t.site_id AND sm.member_id = t.member_id
     WHERE t.id = p_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'unknown');
    ELSIF r.revoked_at IS NOT NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'revoked');
    ELSIF r.expires_at <= clock_timestamp() THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'expired');
    ELSIF r.role IS NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'no_site_role');
    END IF;
    RETURN jsonb_build_object(
        'ok', true,
        'organization_id', r.organization_id, 'organization', r.organization_slug,
        'site_id', r.site_id, 'site', r.site_slug, 'site_name', r.site_name,
        'member_id', r.member_id, 'member', r.member_handle, 'display_name', r.display_name, 'role', r.role,
        'session_id', r.id,
        'expires_at', r.expires_at);
END
$$;

-- Called by the extension while it resolves an invitation link (that invitation's site only).
CREATE FUNCTION querylayer.resolve_invitation(p_id uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    SELECT i.*, s.slug AS site_slug, s.name AS site_name, m.handle AS member_handle, m.display_name, sm.role
      INTO r
      FROM querylayer.member_invitations i
      JOIN querylayer.sites s ON s.id = i.site_id
      JOIN querylayer.members m ON m.id = i.member_id
      LEFT JOIN querylayer.site_members sm ON sm.site_id = i.site_id AND sm.member_id = i.member_id
     WHERE i.id = p_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'unknown');
    ELSIF r.used_at IS NOT NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'used');
    ELSIF r.revoked_at IS NOT NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'revoked');
    ELSIF r.expires_at <= clock_timestamp() THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'expired');
    ELSIF r.role IS NULL THEN
        RETURN jsonb_build_object('ok', false, 'reason', 'no_site_role');
    END IF;
    RETURN jsonb_build_object(
        'ok', true, 'invitation_id', r.id,
        'organization_id', r.organization_id, 'site_id', r.site_id, 'site', r.site_slug, 'site_name', r.site_name,
        'member_id', r.member_id, 'member', r.member_handle, 'display_name', r.display_name, 'role', r.role,
        'expires_at', r.expires_at);
END
$$;

-- Issues an invitation and returns its one-time token. The only place the token exists.
CREATE FUNCTION querylayer.issue_invitation(p_site_id uuid, p_member_id uuid, p_expires_at timestamptz,
                                            p_created_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site   querylayer.sites;
    v_member querylayer.members;
    v_inv    querylayer.member_invitations;
    v_new    record;
BEGIN
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    SELECT * INTO v_member FROM querylayer.members WHERE id = p_member_id;
    IF NOT EXISTS (SELECT 1 FROM querylayer.site_members WHERE site_id = p_site_id AND member_id = p_member_id) THEN
        RAISE EXCEPTION 'member: % has no role on this site; give them one first', v_member.handle USING ERRCODE = 'QL422';
    END IF;
    IF p_expires_at IS NULL OR p_expires_at <= now() OR p_expires_at > now() + interval '30 days' THEN
        RAISE EXCEPTION 'expires_at: an invitation lives between a moment and 30 days' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_new FROM querylayer.new_secret('qli'::text);
    INSERT INTO querylayer.member_invitations (site_id, organization_id, member_id, prefix, expires_at, created_by)
    VALUES (p_site_id, v_site.organization_id, p_member_id, v_new.prefix, p_expires_at, p_created_by)
    RETURNING * INTO v_inv;
    INSERT INTO querylayer.credentials (fingerprint, kind, subject_id, site_id, organization_id)
    VALUES (v_new.fingerprint, 'invitation', v_inv.id, v_inv.site_id, v_inv.organization_id);
    PERFORM querylayer.audit('member.invite'::text, v_inv.id::text,
        jsonb_build_object('member_id', p_member_id, 'expires_at', p_expires_at));
    RETURN jsonb_build_object(
        'invitation_id', v_inv.id, 'token', v_new.secret, 'prefix', v_inv.prefix,
        'site', v_site.slug, 'member', v_member.handle, 'expires_at', v_inv.expires_at,
        -- Relative to the edge's public URL: the dashboard's page for setting the password.
        'path', '/invite?token=' || v_new.secret);
END
$$;

-- Called by the extension when an invitation is redeemed, with the argon2id hash it computed
-- and the sign-in lookup of this site and member. Marks the invitation used, sets the password
-- and ends the member's open sessions on the site (a new password starts afresh).
CREATE FUNCTION querylayer.set_member_password(p_invitation_id uuid, p_hash text, p_lookup bytea) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_inv querylayer.member_invitations;
    v_ended integer;
BEGIN
    UPDATE querylayer.member_invitations SET used_at = clock_timestamp()
     WHERE id = p_invitation_id AND used_at IS NULL AND revoked_at IS NULL AND expires_at > now()
    RETURNING * INTO v_inv;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'authentication failed' USING ERRCODE = '28000';
    END IF;
    INSERT INTO querylayer.member_passwords (site_id, organization_id, member_id, lookup_sha256, password_hash, invitation_id)
    VALUES (v_inv.site_id, v_inv.organization_id, v_inv.member_id, p_lookup, p_hash, v_inv.id)
    ON CONFLICT (site_id, member_id) DO UPDATE
       SET lookup_sha256 = EXCLUDED.lookup_sha256, password_hash = EXCLUDED.password_hash,
           set_at = clock_timestamp(), invitation_id = EXCLUDED.invitation_id;
    WITH ended AS (
        UPDATE querylayer.member_sessions SET revoked_at = now(), revoked_reason = 'password set'
         WHERE site_id = v_inv.site_id AND member_id = v_inv.member_id AND revoked_at IS NULL
        RETURNING id)
    SELECT count(*) INTO v_ended FROM ended;
    -- No backend goes on acting through an ended session.
    PERFORM querylayer.end_credential_sessions(s.id)
       FROM querylayer.member_sessions s
      WHERE s.site_id = v_inv.site_id AND s.member_id = v_inv.member_id AND s.revoked_reason = 'password set'
        AND s.revoked_at = now();
    INSERT INTO querylayer.audit_events (site_id, organization_id, principal_kind, member_id, action, target, detail)
    VALUES (v_inv.site_id, v_inv.organization_id, 'member', v_inv.member_id, 'member.password', v_inv.id::text,
            jsonb_build_object('sessions_ended', v_ended));
    RETURN jsonb_build_object('site_id', v_inv.site_id, 'member_id', v_inv.member_id, 'sessions_ended', v_ended);
END
$$;

-- Called by the extension at sign-in, in the site's resolving context, before the password is
-- checked: is the member locked out (five failures in fifteen minutes), and do they still hold
-- a role here? Prunes the member's attempts older than a day.
CREATE FUNCTION querylayer.sign_in_gate(p_site_id uuid, p_member_id uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_failures integer;
    v_oldest   timestamptz;
BEGIN
    DELETE FROM querylayer.sign_in_attempts
     WHERE site_id = p_site_id AND member_id = p_member_id AND at < now() - interval '1 day';
    SELECT count(*), min(at) INTO v_failures, v_oldest FROM querylayer.sign_in_attempts
     WHERE site_id = p_site_id AND member_id = p_member_id AND NOT succeeded AND at > now() - interval '15 minutes';
    RETURN jsonb_build_object(
        'locked', v_failures >= 5,
        'retry_after_seconds', CASE WHEN v_failures >= 5
            THEN greatest(1, ceil(extract(epoch FROM v_oldest + interval '15 minutes' - now())))::integer END,
        'has_role', EXISTS (SELECT 1 FROM querylayer.site_members WHERE site_id = p_site_id AND member_id = p_member_id));
END
$$;

-- Called by the extension after a password check that failed or was refused (locked out, no
-- role): one attempt row and one audit record, committed with the refusal.
CREATE FUNCTION querylayer.record_sign_in_failure(p_site_id uuid, p_member_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_reason = 'wrong_password' THEN
        INSERT INTO querylayer.sign_in_attempts (site_id, member_id, succeeded) VALUES (p_site_id, p_member_id, false);
    END IF;
    INSERT INTO querylayer.audit_events (site_id, organization_id, principal_kind, member_id, action, outcome, detail)
    VALUES (p_site_id, querylayer.ctx_organization_id(), 'anonymous', p_member_id, 'session.sign_in', 'denied',
            jsonb_build_object('reason', p_reason));
END
$$;

-- Called by the extension after a good password: a new session (always a new id and secret;
-- nothing a browser presented before is reused). Returns its secret, once.
CREATE FUNCTION querylayer.open_member_session(p_site_id uuid, p_member_id uuid) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_site querylayer.sites;
    v_sess querylayer.member_sessions;
    v_new  record;
BEGIN
    SELECT * INTO v_site FROM querylayer.sites WHERE id = p_site_id;
    SELECT * INTO v_new FROM querylayer.new_secret('qls'::text);
    INSERT INTO querylayer.member_sessions (site_id, organization_id, member_id, prefix, expires_at, created_by)
    VALUES (p_site_id, v_site.organization_id, p_member_id, v_new.prefix, now() + interval '12 hours', 'sign-in')
    RETURNING * INTO v_sess;
    INSERT INTO querylayer.credentials (fingerprint, kind, subject_id, site_id, organization_id)
    VALUES (v_new.fingerprint, 'member_session', v_sess.id, v_sess.site_id, v_sess.organization_id);
    INSERT INTO querylayer.sign_in_attempts (site_id, member_id, succeeded) VALUES (p_site_id, p_member_id, true);
    INSERT INTO querylayer.audit_events (site_id, organization_id, principal_kind, member_id, action, target)
    VALUES (p_site_id, v_site.organization_id, 'member', p_member_id, 'session.sign_in', v_sess.id::text);
    RETURN jsonb_build_object('ok', true, 'session_id', v_sess.id, 'secret', v_new.secret, 'prefix', v_sess.prefix,
                              'site', v_site.slug, 'expires_at', v_sess.expires_at);
END
$$;

-- -------------------------------------------------------------------------------------------
-- Member functions: sessions and invitations.

-- Resolves a dashboard session cookie (the SHA-256 of its secret) and holds the member's
-- context until the transaction ends, like authenticate_member. A state-changing request must
-- carry the session's CSRF token (the result's csrf_token, which every page embeds): a wrong one
-- is refused here, and without one the transaction is read-only, so nothing can change in it.
-- SECURITY DEFINER: reads the private credential and session tables.
CREATE FUNCTION querylayer_api.authenticate_session(p_fingerprint bytea, p_csrf_token text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v jsonb;
BEGIN
    v := querylayer.session_authenticate(p_fingerprint, p_csrf_token);
    IF v->>'csrf' = 'mismatch' THEN
        RAISE EXCEPTION 'csrf_token: the request''s CSRF token does not belong to its session' USING ERRCODE = 'QL403',
            HINT = 'reload the page and submit its form again';
    END IF;
    RETURN v - 'csrf';
END
$$;

-- Ends the session acting now (the dashboard's sign-out).
CREATE FUNCTION querylayer_api.sign_out() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    IF querylayer.ctx_member_session_id() IS NULL THEN
        RAISE EXCEPTION 'sign_out ends a dashboard session; this request carries a member token' USING ERRCODE = 'QL422',
            HINT = 'member tokens are revoked by an operator (querylayer admin revoke-member-token)';
    END IF;
    PERFORM querylayer.revoke_credential('querylayer.member_sessions'::regclass, querylayer.ctx_member_session_id(), 'signed out'::text);
    RETURN jsonb_build_object('session_id', querylayer.ctx_member_session_id(), 'ended', true);
END
$$;

-- The site's open sessions: a member sees their own; owners and admins see everyone's.
CREATE FUNCTION querylayer_api.console_list_member_sessions(p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('member_sessions'::text, p_cursor);
    RETURN querylayer.page('member_sessions'::text, 'sessions'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', querylayer.page_key(s.created_at), 'id', s.id, 'item', jsonb_build_object(
                'session_id', s.id, 'member', m.handle, 'prefix', s.prefix, 'created_at', s.created_at,
                'expires_at', s.expires_at, 'current', s.id IS NOT DISTINCT FROM querylayer.ctx_member_session_id()))
                ORDER BY s.created_at DESC, s.id DESC)
          FROM (SELECT * FROM querylayer.member_sessions x
                 WHERE x.site_id = querylayer.ctx_site_id() AND x.revoked_at IS NULL AND x.expires_at > now()
                   AND (x.member_id = querylayer.ctx_member_id() OR querylayer.ctx_member_role() IN ('owner', 'admin'))
                   AND (v_after.after_id IS NULL
                        OR (x.created_at, x.id) < (v_after.after_key::timestamptz, v_after.after_id))
                 ORDER BY x.created_at DESC, x.id DESC LIMIT p_limit + 1) s
          JOIN querylayer.members m ON m.id = s.member_id));
END
$$;

-- Ends a session at once: one's own, or (owner, admin) anyone's on the site.
CREATE FUNCTION querylayer_api.console_revoke_member_session(p_session_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v querylayer.member_sessions;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    SELECT * INTO v FROM querylayer.member_sessions WHERE id = p_session_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session_id: no member session % on this site', p_session_id USING ERRCODE = 'QL404';
    END IF;
    IF v.member_id <> querylayer.ctx_member_id() THEN
        PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    END IF;
    RETURN querylayer.revoke_credential('querylayer.member_sessions'::regclass, p_session_id, coalesce(p_reason, 'revoked'));
END
$$;

-- The roles an owner or admin may hand out: owners any, admins any but owner; and nobody but an
-- owner changes an owner's role.
CREATE FUNCTION querylayer.check_role_grant(p_member_id uuid, p_role text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_current text;
BEGIN
    IF p_role IS NOT NULL AND p_role NOT IN ('owner', 'admin', 'editor', 'viewer') THEN
        RAISE EXCEPTION 'role must be owner, admin, editor or viewer; got %', quote_literal(p_role) USING ERRCODE = '22023';
    END IF;
    SELECT role INTO v_current FROM querylayer.site_members WHERE site_id = querylayer.ctx_site_id() AND member_id = p_member_id;
    IF querylayer.ctx_member_role() <> 'owner' AND (p_role = 'owner' OR v_current = 'owner') THEN
        RAISE EXCEPTION 'role: only an owner grants or changes the owner role' USING ERRCODE = 'QL403';
    END IF;
END
$$;

-- An owner or admin invites a member of the organization (created when the handle is new) to
-- this site: the role is given or changed, and a one-time link to set a password is returned.
CREATE FUNCTION querylayer_api.console_invite_member(
    p_member text, p_role text DEFAULT NULL, p_display_name text DEFAULT NULL,
    p_expires_at timestamptz DEFAULT now() + interval '72 hours'
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_member querylayer.members;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    IF p_member IS NULL OR p_member !~ '^[a-z0-9][a-z0-9._-]{0,62}$' THEN
        RAISE EXCEPTION 'member: a handle of lowercase letters, digits and ._- is required; got %',
            coalesce(quote_literal(p_member), 'NULL') USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_member FROM querylayer.members
     WHERE organization_id = querylayer.ctx_organization_id() AND handle = p_member;
    IF NOT FOUND THEN
        IF p_role IS NULL THEN
            RAISE EXCEPTION 'role: % is a new member; give them a role on this site', p_member USING ERRCODE = '22023';
        END IF;
        INSERT INTO querylayer.members (organization_id, handle, display_name)
        VALUES (querylayer.ctx_organization_id(), p_member, coalesce(nullif(p_display_name, ''), p_member))
        RETURNING * INTO v_member;
        PERFORM querylayer.audit('member.create'::text, v_member.id::text, jsonb_build_object('handle', v_member.handle));
    END IF;
    IF p_role IS NOT NULL THEN
        PERFORM querylayer.check_role_grant(v_member.id, p_role);
        INSERT INTO querylayer.site_members (site_id, member_id, role) VALUES (querylayer.ctx_site_id(), v_member.id, p_role)
        ON CONFLICT (site_id, member_id) DO UPDATE SET role = EXCLUDED.role, granted_at = now();
        -- A member acting with the old role right now stops: their tokens' and sessions' backends end.
        PERFORM querylayer.end_member_credentials(querylayer.ctx_site_id(), v_member.id);
        PERFORM querylayer.audit('member.role'::text, v_member.id::text, jsonb_build_object('role', p_role));
    END IF;
    RETURN querylayer.issue_invitation(querylayer.ctx_site_id(), v_member.id, p_expires_at,
                                       'member:' || querylayer.ctx_member_id());
END
$$;

-- The site's members with their roles and whether they can sign in (owner, admin).
CREATE FUNCTION querylayer_api.console_list_members(p_limit integer DEFAULT 100, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    PERFORM querylayer.page_limit(p_limit);
    v_after := querylayer.page_after('members'::text, p_cursor);
    RETURN querylayer.page('members'::text, 'members'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', x.handle, 'id', x.id, 'item', jsonb_build_object(
                'member', x.handle, 'display_name', x.display_name, 'role', x.role, 'granted_at', x.granted_at,
                'has_password', EXISTS (SELECT 1 FROM querylayer.member_passwords p
                                         WHERE p.site_id = x.site_id AND p.member_id = x.id),
                'open_invitations', (SELECT count(*) FROM querylayer.member_invitations i
                                      WHERE i.site_id = x.site_id AND i.member_id = x.id AND i.used_at IS NULL
                                        AND i.revoked_at IS NULL AND i.expires_at > now())))
                ORDER BY x.handle, x.id)
          FROM (SELECT m.id, m.handle, m.display_name, sm.role, sm.granted_at, sm.site_id
                  FROM querylayer.site_members sm JOIN querylayer.members m ON m.id = sm.member_id
                 WHERE sm.site_id = querylayer.ctx_site_id()
                   AND (v_after.after_id IS NULL OR (m.handle, m.id) > (v_after.after_key, v_after.after_id))
                 ORDER BY m.handle, m.id LIMIT p_limit + 1) x));
END
$$;

-- -------------------------------------------------------------------------------------------
-- The dashboard's readings.

-- The content list pages through a site's items by their last change.
CREATE INDEX content_items_site_updated ON querylayer.content_items (site_id, updated_at DESC, id DESC);

-- Pending proposals by risk (high first), oldest first within a risk: what waits for a human.
CREATE FUNCTION querylayer_api.console_inbox(p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
    v_rank  integer;
    v_at    timestamptz;
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    PERFORM querylayer.page_limit(p_limit, 200);
    v_after := querylayer.page_after('inbox'::text, p_cursor);
    IF v_after.after_id IS NOT NULL THEN
        BEGIN
            v_rank := split_part(v_after.after_key, ' ', 1)::integer;
            v_at := substr(v_after.after_key, strpos(v_after.after_key, ' ') + 1)::timestamptz;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'cursor: not a cursor of this list' USING ERRCODE = '22023',
                HINT = 'pass the next_cursor of the previous page unchanged';
        END;
    END IF;
    RETURN (
    -- Only the columns the page needs: the whole pending set is scanned for the counts.
    WITH pending AS MATERIALIZED (
        SELECT p.id, p.risk, p.created_at, p.agent_id, p.run_id,
               CASE p.risk WHEN 'high' THEN 3 WHEN 'medium' THEN 2 ELSE 1 END AS rank
          FROM querylayer.proposals p
         WHERE p.site_id = querylayer.ctx_site_id()
           AND NOT EXISTS (SELECT 1 FROM querylayer.proposal_decisions d WHERE d.proposal_id = p.id)),
    counts AS (SELECT risk, count(*) AS n FROM pending GROUP BY risk)
    SELECT jsonb_build_object(
        'pending', (SELECT coalesce(sum(n), 0) FROM counts),
        'by_risk', (SELECT jsonb_object_agg(risk, n) FROM counts))
        || querylayer.page('inbox'::text, 'proposals'::text, p_limit, (
            SELECT jsonb_agg(jsonb_build_object(
                       'key', x.rank::text || ' ' || querylayer.page_key(x.created_at), 'id', x.id,
                       'item', querylayer.proposal_json(x.id) || jsonb_build_object(
                          'agent', (SELECT handle FROM querylayer.agents WHERE id = x.agent_id),
                          'run_type', (SELECT run_type FROM querylayer.runs WHERE id = x.run_id),
                          'slugs', (SELECT coalesce(jsonb_agg(c.slug ORDER BY i.ordinal), '[]')
                                      FROM querylayer.proposal_items i JOIN querylayer.content_items c ON c.id = i.content_id
                                     WHERE i.proposal_id = x.id)))
                          ORDER BY x.rank DESC, x.created_at, x.id)
              FROM (SELECT * FROM pending y
                     WHERE v_rank IS NULL OR y.rank < v_rank
                        OR (y.rank = v_rank AND (y.created_at, y.id) > (v_at, v_after.after_id))
                     ORDER BY y.rank DESC, y.created_at, y.id LIMIT p_limit + 1) x)));
END
$$;

-- Content by state, newest change first, with the count in each state; `p_cursor` is the
-- previous page's next_cursor.
CREATE FUNCTION querylayer_api.console_list_content(p_state text DEFAULT NULL, p_limit integer DEFAULT 50,
                                                    p_cursor text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after record;
    v_ids   uuid[];
    v_keys  timestamptz[];
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    IF p_state IS NOT NULL AND p_state NOT IN ('draft', 'published', 'archived') THEN
        RAISE EXCEPTION 'state must be draft, published or archived; got %', quote_literal(p_state) USING ERRCODE = '22023';
    END IF;
    PERFORM querylayer.page_limit(p_limit, 200);
    v_after := querylayer.page_after('desk_content'::text, p_cursor);
    SELECT array_agg(c.id ORDER BY c.updated_at DESC, c.id DESC), array_agg(c.updated_at ORDER BY c.updated_at DESC, c.id DESC)
      INTO v_ids, v_keys
      FROM (SELECT c.id, c.updated_at FROM querylayer.content_items c
             WHERE c.site_id = querylayer.ctx_site_id()
               -- content_state's rule, written here as in list_content (pg_tests/reading.rs).
               AND (p_state IS NULL
                    OR p_state = CASE WHEN c.archived_at IS NOT NULL THEN 'archived'
                                      WHEN c.published_revision_id IS NOT NULL THEN 'published' ELSE 'draft' END)
               AND (v_after.after_id IS NULL
                    OR (c.updated_at, c.id) < (v_after.after_key::timestamptz, v_after.after_id))
             ORDER BY c.updated_at DESC, c.id DESC LIMIT p_limit + 1) c;
    RETURN jsonb_build_object(
        'items', querylayer.content_json_list(v_ids[1:p_limit]),
        'next_cursor', querylayer.next_cursor('desk_content'::text, p_limit, coalesce(cardinality(v_ids), 0),
                                              querylayer.page_key(v_keys[p_limit]), v_ids[p_limit]),
        'counts', (SELECT jsonb_build_object(
                       'draft', count(*) FILTER (WHERE archived_at IS NULL AND published_revision_id IS NULL),
                       'published', count(*) FILTER (WHERE archived_at IS NULL AND published_revision_id IS NOT NULL),
                       'archived', count(*) FILTER (WHERE archived_at IS NOT NULL))
                     FROM querylayer.content_items WHERE site_id = querylayer.ctx_site_id()));
END
$$;

-- Runs filtered by outcome (or `open`), agent handle and start time, newest first.
CREATE FUNCTION querylayer_api.console_list_runs(
    p_outcome text DEFAULT NULL, p_agent text DEFAULT NULL, p_since timestamptz DEFAULT NULL,
    p_until timestamptz DEFAULT NULL, p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    RETURN querylayer.runs_page('desk_runs'::text, p_limit, 200, p_cursor, p_outcome, p_agent, p_since, p_until);
END
$$;

-- The organization's agents with their permissions on this site and their live connections.
CREATE FUNCTION querylayer_api.console_list_agents() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(NULL::text[]);
    RETURN jsonb_build_object(
        'scopes', (SELECT jsonb_agg(jsonb_build_object('scope', scope, 'description', description) ORDER BY scope)
                     FROM querylayer.scopes),
        'agents', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'agent', a.handle, 'kind', a.kind, 'profile_id', a.profile_id, 'profile_name', a.profile_name,
                       'scopes', to_jsonb(ARRAY(SELECT p.scope FROM querylayer.agent_site_permissions p
                                                 WHERE p.site_id = querylayer.ctx_site_id() AND p.agent_id = a.id
                                                 ORDER BY p.scope)),
                       'live_connections', (SELECT count(*) FROM querylayer.connections c
                                             WHERE c.site_id = querylayer.ctx_site_id() AND c.agent_id = a.id
                                               AND c.revoked_at IS NULL AND c.expires_at > now()))
                       ORDER BY a.handle), '[]')
                     FROM querylayer.agents a WHERE a.organization_id = querylayer.ctx_organization_id()));
END
$$;

-- Owners and admins grant an organization agent scopes on this site.
CREATE FUNCTION querylayer_api.console_grant_agent_scopes(p_agent text, p_scopes text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.change_agent_scopes(querylayer.ctx_site_id(),
        querylayer.agent_by_handle(querylayer.ctx_organization_id(), p_agent), p_scopes, true,
        'member:' || querylayer.ctx_member_id());
END
$$;

-- Owners and admins withdraw scopes; the agent's connections lose them at their next request.
CREATE FUNCTION querylayer_api.console_revoke_agent_scopes(p_agent text, p_scopes text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.change_agent_scopes(querylayer.ctx_site_id(),
        querylayer.agent_by_handle(querylayer.ctx_organization_id(), p_agent), p_scopes, false, NULL::text);
END
$$;

-- The site's audit trail (owner, admin), newest first, filtered by time, actor (a principal
-- kind, or an agent's or member's handle) and action (exact, or a prefix ending in '.').
CREATE FUNCTION querylayer_api.console_list_audit(
    p_since timestamptz DEFAULT NULL, p_until timestamptz DEFAULT NULL, p_actor text DEFAULT NULL,
    p_action text DEFAULT NULL, p_limit integer DEFAULT 50, p_cursor text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_after  record;
    v_before bigint;
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    PERFORM querylayer.page_limit(p_limit, 200);
    v_after := querylayer.page_after('audit'::text, p_cursor);
    IF v_after.after_key IS NOT NULL THEN
        BEGIN
            v_before := v_after.after_key::bigint;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'cursor: not a cursor of this list' USING ERRCODE = '22023',
                HINT = 'pass the next_cursor of the previous page unchanged';
        END;
    END IF;
    -- Audit records are numbered, not keyed by uuid: the cursor carries the number, and the nil uuid.
    RETURN querylayer.page('audit'::text, 'events'::text, p_limit, (
        SELECT jsonb_agg(jsonb_build_object('key', e.id::text, 'id', '00000000-0000-0000-0000-000000000000'::uuid,
               'item', jsonb_build_object(
               'id', e.id, 'at', e.at, 'principal_kind', e.principal_kind, 'agent', e.agent, 'member', e.member,
               'operator_role', e.operator_role, 'action', e.action, 'outcome', e.outcome, 'target', e.target,
               'detail', e.detail)) ORDER BY e.id DESC)
      FROM (SELECT x.*, a.handle AS agent, m.handle AS member
              FROM querylayer.audit_events x
              LEFT JOIN querylayer.agents a ON a.id = x.agent_id
              LEFT JOIN querylayer.members m ON m.id = x.member_id
             WHERE x.site_id = querylayer.ctx_site_id()
               AND (v_before IS NULL OR x.id < v_before)
               AND (p_since IS NULL OR x.at >= p_since)
               AND (p_until IS NULL OR x.at < p_until)
               AND (p_action IS NULL OR x.action = p_action
                    OR (right(p_action, 1) = '.' AND starts_with(x.action, p_action)))
               AND (p_actor IS NULL OR x.principal_kind = p_actor OR a.handle = p_actor OR m.handle = p_actor)
             ORDER BY x.id DESC LIMIT p_limit + 1) e));
END
$$;

-- Walks the site's hash chain (owner, admin): the dashboard's ledger verification status.
CREATE FUNCTION querylayer_api.console_verify_ledger() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.require_member(ARRAY['owner', 'admin']::text[]);
    RETURN querylayer.verify_ledger_site(querylayer.ctx_site_id()) || jsonb_build_object('verified_at', clock_timestamp());
END
$$;

GRANT EXECUTE ON FUNCTION querylayer_api.authenticate_session, querylayer_api.sign_out,
    querylayer_api.console_list_member_sessions,
    querylayer_api.console_revoke_member_session, querylayer_api.console_invite_member,
    querylayer_api.console_list_members, querylayer_api.console_inbox, querylayer_api.console_list_content,
    querylayer_api.console_list_runs, querylayer_api.console_list_agents, querylayer_api.console_grant_agent_scopes,
    querylayer_api.console_revoke_agent_scopes, querylayer_api.console_list_audit, querylayer_api.console_verify_ledger
    TO querylayer_edge;

-- -------------------------------------------------------------------------------------------
-- Operators.

-- Invites a member to a site: creates the member when the handle is new (p_display_name), sets
-- the role when one is given, and returns the one-time link to set a password.
CREATE FUNCTION querylayer_api.invite_member(
    p_site text, p_member text, p_role text DEFAULT NULL, p_display_name text DEFAULT NULL,
    p_expires_at timestamptz DEFAULT now() + interval '72 hours'
) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_site   querylayer.sites;
    v_member querylayer.members;
BEGIN
    v_site := querylayer.enter_operator_site(p_site);
    IF NOT EXISTS (SELECT 1 FROM querylayer.members WHERE organization_id = v_site.organization_id AND handle = p_member) THEN
        PERFORM querylayer_api.create_member((SELECT slug FROM querylayer.organizations WHERE id = v_site.organization_id),
                                             p_member, p_display_name);
    END IF;
    IF p_role IS NOT NULL THEN
        PERFORM querylayer_api.set_member_role(p_site, p_member, p_role);
    END IF;
    v_site := querylayer.enter_operator_site(p_site);
    v_member := querylayer.member_by_handle(v_site.organization_id, p_member);
    RETURN querylayer.issue_invitation(v_site.id, v_member.id, p_expires_at, 'operator:' || querylayer.outer_user());
END
$$;

-- Ends a member's dashboard session at once.
CREATE FUNCTION querylayer_api.revoke_member_session(p_session_id uuid, p_reason text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM querylayer.enter_operator(NULL::uuid);
    PERFORM querylayer.enter_operator(querylayer.site_of_credential('querylayer.member_sessions'::regclass, p_session_id));
    RETURN querylayer.revoke_credential('querylayer.member_sessions'::regclass, p_session_id, coalesce(p_reason, 'revoked'));
END
$$;
