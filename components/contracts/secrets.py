"""Credentials out of whatever Stoke echoes: `without_secrets` hides the password of every URL's
user info and the value of every parameter named like a credential, in a value or in a whole line.

A value a user gives (a --data-service address, a bucket URI, a database URL, a queue) may carry a
password, and it comes back in error lines, logs, state messages and printed commands. Every layer
reaches this one function: the error line and the log filter of every program
(components/contracts/program.py: `printable`), and the messages that echo a value before any of
those print it. What is hidden: the text after `user:` up to the token's last `@` (so a password
holding an unencoded `@` or `/`, as cloud secret keys do, goes whole), with or without a scheme,
and `name=value` where the name says password, secret, token, key, credential, auth or signature.
What is kept: user names, hosts, ports, paths and every other parameter. A token that only looks
like user info (`host:8080/a@b`) loses more than it needs to; nothing leaks.
"""
from __future__ import annotations

import re

HIDDEN = "***"
# scheme://user:password@ : the password runs to the token's last @ (quotes and spaces end a token).
_URL_USERINFO = re.compile(r"(?P<lead>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*):[^\s'\"]*@")
# user:password@host without a scheme (grpc's HOST:PORT spelling), where a token starts.
_BARE_USERINFO = re.compile(r"(?<![^\s'\"(=,\[])(?P<lead>[^\s'\"/?#@:=,()\[\]]+):[^\s'\"/@]*@(?=[A-Za-z0-9\[])")
# Names of the query (or `;`/space separated) parameters a URL may carry a credential in: password,
# sslpassword, passfile, sslkey, api_key, auth_token, client_secret, X-Amz-Credential, X-Goog-Signature, sig...
_SECRET_PARAMETER = re.compile(
    r"(?i)(^|[?&;\s])((?:[^=?&;#\s/'\"]*(?:pass|pwd|secret|token|key|credential|auth|signature)[^=?&;#\s'\"]*)|sig)"
    r"=([^&;#\s'\"]*)")


def without_secrets(text: str) -> str:
    """`text` with every password and credential parameter it holds replaced by ***."""
    text = _URL_USERINFO.sub(rf"\g<lead>:{HIDDEN}@", text)
    text = _BARE_USERINFO.sub(rf"\g<lead>:{HIDDEN}@", text)
    return _SECRET_PARAMETER.sub(rf"\1\2={HIDDEN}", text)
