"""Passwords and credentials never come back in what Stoke echoes: the one scrubber on database URLs,
service addresses, bucket URIs and signed URLs, and every program's error line, JSON error and logs."""
import argparse
import json
import logging

import pytest

from components.common import program
from components.contracts.secrets import (
    HIDDEN,
    SOURCE_ENV,
    SourceCredentials,
    given,
    has_secrets,
    recorded,
    without_query,
    without_secrets,
)

SECRET = "hunter2"


def test_printed_database_urls_hide_their_password():
    assert without_secrets("postgresql+asyncpg://prefect:p%40ss@db:5432/prefect") == \
        "postgresql+asyncpg://prefect:***@db:5432/prefect"
    assert without_secrets("/home/me/.prefect/prefect.db") == "/home/me/.prefect/prefect.db"


@pytest.mark.parametrize("url, secrets", [
    ("postgresql://db/prefect?password=hunter2", ["hunter2"]),
    ("postgresql://db/prefect?sslmode=require&sslpassword=hunter2", ["hunter2"]),
    ("postgresql://db/prefect?PassWord=hunter2&user=me", ["hunter2"]),
    ("postgresql://db/prefect?passfile=/home/me/.pgpass", ["/home/me/.pgpass", "%2Fhome%2Fme"]),
    ("postgresql://db/prefect?sslkey=/k/client.key&api_token=t0k&client_secret=s3c", ["client.key", "t0k", "s3c"]),
    ("postgresql://prefect@db/prefect?password=p%40ss", ["p%40ss", "p@ss"]),
    ("postgresql://prefect:@db/prefect?connect_timeout=5&sslpassword=", ["prefect:@"]),
    ("postgresql://u:pw@db/prefect?password=hunter2 host=db password=x2", ["hunter2", "=x2"]),
    ("postgresql://u:p%3Ass@db/prefect?password=a&password=b", ["p%3Ass", "=a", "=b"]),
    ("postgresql://db/prefect?password=hunter2#frag", ["hunter2"]),
    ("postgresql://db/prefect;password=hunter2", ["hunter2"]),
])
def test_printed_database_urls_hide_every_credential_they_carry(url, secrets):
    shown = without_secrets(url)
    assert "db" in shown and not any(secret in shown for secret in secrets), shown


def test_printed_database_urls_keep_their_host_and_database_and_hide_their_query():
    assert without_secrets("postgresql+asyncpg://prefect:pw@db:5432/prefect?sslmode=require&application_name=stoke") \
        == "postgresql+asyncpg://prefect:***@db:5432/prefect?***"
    for kept in ("sqlite+aiosqlite:////home/me/.prefect/prefect.db", "/home/key/prefect.db",
                 "postgresql://***@db/prefect?***"):
        assert without_secrets(kept) == kept


@pytest.mark.parametrize("text, kept", [
    ("grpc://u:hunter2@dispatcher:5050", "grpc://u:***@dispatcher:5050"),
    ("u:hunter2@dispatcher:5050", "u:***@dispatcher:5050"),  # grpc's HOST:PORT spelling, no scheme
    ("'grpc://:hunter2@[::1]:5050'", "'grpc://:***@[::1]:5050'"),
    ("GRPC://u:hun%40ter2@h:5050", "GRPC://u:***@h:5050"),
    ("s3://AKIAEXAMPLE:wJal/K7MD+hunter2@bucket/photos", "s3://AKIAEXAMPLE:***@bucket/photos"),  # a raw secret key
    ("ftp://me:p@ss@hunter2@host/x.png", "ftp://me:***@host/x.png"),  # unencoded @ in the password
    ("cannot reach http://u:hunter2@127.0.0.1:9/v1: refused", "cannot reach http://u:***@127.0.0.1:9/v1: refused"),
    ("s3://a:hunter2@b/x and gs://c:hunter2@d/y", "s3://a:***@b/x and gs://c:***@d/y"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2Fhunter2&X-Amz-Signature=hunter2&X-Amz-Security-Token=hunter2",
     "https://b.s3.amazonaws.com/k?***"),
    ("https://acct.blob.core.windows.net/c/b?sv=2020-01&sig=hunter2%2B", "https://acct.blob.core.windows.net/c/b?***"),
    ("gs://bucket/x?token=hunter2", "gs://bucket/x?token=***"),
    ("s3://b/k?X-Amz-Signature=hunter2&versionId=3", "s3://b/k?X-Amz-Signature=***&versionId=3"),
])
def test_every_spelling_of_a_credential_is_hidden_and_the_rest_kept(text, kept):
    assert without_secrets(text) == kept


SCHEMES = ["http", "https", "s3", "s3a", "gs", "gcs", "ftp", "sftp", "ssh", "smb", "webdav", "hdfs", "redis",
           "amqp", "postgres", "postgresql+psycopg", "mysql", "mongodb+srv", "grpc", "HTTP", "S3"]
PASSWORDS = ["hunter2", 'hun"ter2', "hun'ter2", "hun ter2", "hun@ter2", "hun:ter2", "hun%40ter2", "hun/ter2",
             "hun@ter2@x", "hunter2\\", "hun#ter2", "hun?ter2", "hun&ter2", "123hunter2", "hunter2=="]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_in_any_scheme_is_hidden_whatever_it_holds(scheme, password):
    for text in (f"{scheme}://alice:{password}@host:9000/photos/manifest.csv",
                 f"source {scheme}://alice:{password}@host/photos does not exist",
                 repr(f"{scheme}://alice:{password}@host/a@2x.png"),
                 f"'{scheme}://alice:{password}@host/x', '{scheme}://bob:{password}@other/y'"):
        shown = without_secrets(text)
        assert "hun" not in shown and "ter2" not in shown and "alice:***@" in shown, (text, shown)
        assert without_secrets(shown) == shown  # hiding twice hides nothing more


@pytest.mark.parametrize("text, kept", [
    ("http://alice:pw@host/photos/a@2x.png", "http://alice:***@host/photos/a@2x.png"),  # an @ in a path stays
    ("https://TOKEN@github.com/org/photos.csv", "https://***@github.com/org/photos.csv"),  # a token as the user
    ("https://ghp_0123456789abcdefghij@host:443/m.csv", "https://***@host:443/m.csv"),
    ("alice:pa\"ss@host:5050", "alice:***@host:5050"),
    ("(u:hunter2@h:5050)", "(u:***@h:5050)"),
    ("http://host:8080/photos/a@2x.png", "http://host:8080/photos/a@2x.png"),  # a port, not a password
    ("http://u:8080@host/x", "http://u:***@host/x"),  # digits up to an @ are a password
    ("http://u:8080:x/y@host/x", "http://u:***@host/x"),
])
def test_user_info_is_told_from_ports_and_paths(text, kept):
    assert without_secrets(text) == kept


# Passwords that start as a port would: digits, then what no port is followed by.
DIGITS_FIRST = ["2024;Winter", "1234,x", "12)ab", "99]x", "123'x", '123"x', "1234 x", "2024", "8080:x", "1(x",
                "65535!", "7&x", "443=y"]


@pytest.mark.parametrize("scheme", ["http", "https", "s3", "gs", "grpc", "ftp", "HTTPS"])
@pytest.mark.parametrize("password", DIGITS_FIRST)
def test_a_password_that_starts_with_digits_is_no_port(scheme, password):
    """Inside an authority what runs from `:` to a later `@` is a password; a port is only what follows the
    host, up to a `/`, `?`, `#` or the end."""
    for port in ("", ":9000"):
        source = f"{scheme}://bob:{password}@127.0.0.1{port}/photos/manifest.csv"
        kept = f"{scheme}://bob:***@127.0.0.1{port}/photos/manifest.csv"
        assert without_secrets(source) == kept
        assert without_secrets(f"source '{source}' does not exist") == f"source '{kept}' does not exist"
        credentials = SourceCredentials(source)
        assert credentials.given == f"{scheme}://bob:{password}@127.0.0.1{port}"
        assert credentials.hide(source) == kept and credentials.reveal(kept) == source


@pytest.mark.parametrize("password", [p for p in DIGITS_FIRST if " " not in p])
def test_a_bare_password_that_starts_with_digits_is_no_port(password):
    """grpc's HOST:PORT spelling, without a scheme: a bare token ends at a space."""
    assert without_secrets(f"bob:{password}@host:5000") == "bob:***@host:5000"
    assert without_secrets(f"--dispatcher bob:{password}@host:5000/x") == "--dispatcher bob:***@host:5000/x"


@pytest.mark.parametrize("text", ["http://host:8080/photos/a@2x.png", "grpc://host:5050", "host:5050/a@b.png",
                                  "s3://b/k:12/a@2x.png", "http://[::1]:8080/a@2x.png"])
def test_a_port_followed_by_a_path_keeps_an_at_sign_of_that_path(text):
    assert without_secrets(text) == text


SECRET_PARAMETERS = [
    "pw", "PW", "pwd", "passwd", "password", "Password", "PASSWORD", "sslpassword", "passphrase", "pass", "secret",
    "client_secret", "token", "access_token", "refresh_token", "id_token", "auth_token", "api_key", "apikey", "key",
    "API-KEY", "access-key", "private_key", "code", "Code", "sig", "Signature", "signature", "signed", "X-Amz-Signature",
    "X-Amz-Credential", "X-Amz-Security-Token", "AWSAccessKeyId", "X-Goog-Signature", "X-Goog-Credential",
    "GoogleAccessId", "auth", "authorization", "Authorization", "bearer", "sessionid", "jsessionid", "phpsessid",
    "sid", "jwt", "credential", "credentials",
]


@pytest.mark.parametrize("name", SECRET_PARAMETERS)
@pytest.mark.parametrize("value", ["hunter2", "hun%40ter2", 'hun"ter2', "hun'ter2", "hun:ter2@x", "hun/ter2", ""])
def test_a_parameter_named_as_a_credential_is_hidden_in_any_case(name, value):
    """A second net, beside the structure of a URL: text that is no URL, a path's parameters, a bucket key's
    query (a bucket key may hold `?`, so its URL has no query to hide whole)."""
    for text in (f"gs://bucket/photos/m.csv?{name}={value}", f"s3://b/m.csv?v=1&{name}={value}&size=9",
                 f"https://host/m.csv;{name}={value}", f"host=db {name}={value} port=5",
                 f"source 'gs://bucket/m.csv?{name}={value}' does not exist"):
        shown = without_secrets(text)
        assert f"{name}={HIDDEN}" in shown and ("hun" not in shown or not value), (text, shown)
    assert "size=9" in without_secrets(f"s3://b/m.csv?v=1&{name}={value}&size=9")


@pytest.mark.parametrize("text, kept", [
    ("ingest: beam_jobs.ingest --config c.json --s3_session_token hunter2 --json",
     "ingest: beam_jobs.ingest --config c.json --s3_session_token *** --json"),
    ("--s3_secret_access_key 'hun ter2' --s3_access_key_id=hunter2", "--s3_secret_access_key *** --s3_access_key_id=***"),
    ("Discarding unparseable args: ['--s3_session_token', 'hunter2', '--x']",
     "Discarding unparseable args: ['--s3_session_token', ***, '--x']"),
    ("stoke ingest --password\thunter2", "stoke ingest --password\t***"),
    ("--api-key --json", "--api-key --json"),  # an option without its value
    *[(text, text) for text in ["stoke up: error: --auth-string-file /run/auth: no such file"]],
])
def test_an_option_named_as_a_credential_hides_the_value_given_as_its_next_token(text, kept):
    """`--NAME VALUE`, as Beam's and most command lines take an option, as well as `--NAME=VALUE`; an option
    naming a file that holds a credential (`--auth-string-file PATH`) keeps its path."""
    assert without_secrets(text) == kept


@pytest.mark.parametrize("text", ["s3://b/m.csv?v=1&size=9&format=jpeg", "gs://b/search?q=cats&page=2",
                                  "s3://b/k?versionId=3", "gs://b/photos/code/cat.jpg", "/data/key/sig/a.png",
                                  "/data/a?b#c.png", "gs://b/photos/#1.png", "file:///data/a?b.png",
                                  "S3A://b/k#2.png", "http://host/m.csv#row12", "see docs/ingest.md#sources"])
def test_what_a_bucket_key_or_a_path_holds_is_kept(text):
    """`?` and `#` are characters of a local file's name or a bucket's key, not a query; `#rowN` names a
    manifest's row."""
    assert without_secrets(text) == text == recorded(text) == without_query(text)


SIGNED = ["hmac=SIG", "s=SIG", "hdnts=exp=9~acl=*~hmac=SIG", "ticket=SIG", "otp=SIG", "pin=SIG", "cred=SIG",
          "assertion=SIG", "sas=SIG", "hash=SIG", "digest=SIG", "verify=SIG", "access_token=SIG", "SIG", "v=2&x=SIG",
          "url=https%3A%2F%2Fb.s3.amazonaws.com%2Fk%3FX-Amz-Signature%3DSIG", "row1SIG", "a=1#SIG", "=SIG"]


@pytest.mark.parametrize("scheme", ["http", "https", "HTTPS", "ftp", "webdav", "abfs", "grpc", "postgresql"])
@pytest.mark.parametrize("query", SIGNED)
def test_a_web_urls_query_and_fragment_are_hidden_whole_whatever_they_are_named(scheme, query):
    """Whatever names a signature (imgix's s, Akamai's hdnts, a signed URL inside another), a URL's query and
    fragment are a credential or nothing a record needs: hidden whole in text, left out of what is recorded."""
    for mark in "?#":
        url = f"{scheme}://host:9/photos/m.csv{mark}{query}"
        kept = f"{scheme}://host:9/photos/m.csv{mark}{HIDDEN}"
        assert without_secrets(url) == kept and without_secrets(kept) == kept
        assert without_secrets(f"cannot read '{url}': HTTP 403, url={url!r}") == \
            f"cannot read '{kept}': HTTP 403, url={kept!r}"
        assert recorded(url) == without_query(url) == f"{scheme}://host:9/photos/m.csv"
        assert recorded(f"{scheme}://bob:2024;W?x#y@host:9/m.csv{mark}{query}") == f"{scheme}://bob:***@host:9/m.csv"


def test_a_source_with_hidden_credentials_is_given_back_only_from_the_environment(monkeypatch):
    real = "http://alice:pa ss@host:9/m.csv?hmac=t0k"
    shown = recorded(real)
    assert shown == "http://alice:***@host:9/m.csv"
    monkeypatch.setenv(SOURCE_ENV, real)
    assert given(shown) == real and given("/data/photos") == "/data/photos"
    assert given("http://alice:***@host:9/m.csv?token=***") == real  # as a run recorded it before
    with pytest.raises(ValueError, match="other:9"):  # another source never gets this one's password
        given("http://alice:***@other:9/m.csv")
    monkeypatch.delenv(SOURCE_ENV)
    with pytest.raises(ValueError, match=SOURCE_ENV):
        given(shown)
    assert given("/data/***/photos") == "/data/***/photos"


@pytest.mark.parametrize("source", ["http://alice:hun ter2@host:9/m/manifest.csv", "https://TOKEN@host/m/",
                                    'http://alice:hun"t@r2@host/m.csv?token=x'])
def test_the_files_of_a_source_are_named_without_its_credentials_and_read_with_them(source):
    credentials = SourceCredentials(source)
    base = source.rsplit("/", 1)[0]
    for path in ("/img/a.png", "/img/a@2x.png", "/b c/x:y.png"):
        name = credentials.hide(base + path)
        assert "hun" not in name and "TOKEN" not in name and name.endswith(path) and not has_secrets(name)
        assert credentials.reveal(name) == base + path
    assert credentials.reveal(without_secrets(source).replace("host", "other")) == \
        without_secrets(source).replace("host", "other")  # another server never gets the password
    assert SourceCredentials("/data/photos").hide("/data/photos/a.png") == "/data/photos/a.png"


@pytest.mark.parametrize("text", ["http://host:8501/v1/models/stoke:predict", "grpc://127.0.0.1:5050", "s3://b/k@2x.png",
                                  "label cat:3 at 12:30", "gs://b/a b/c.jpg", "span 3: 12 ones and 4 twos"])
def test_text_without_credentials_is_left_as_it_is(text):
    assert without_secrets(text) == text


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("address", ["grpc://u:hunter2@h:5050", "u:hunter2@h:5050", "grpc://u:hunter2@h:99999",
                                     "grpc://u:hunter2@[::1]:5050", "grpc://h:5050/?token=hunter2"])
def test_a_refused_data_service_address_is_echoed_without_its_password(address, tmp_path, capsys):
    from components.train import trainer

    code = trainer.run(["--root", str(tmp_path), "--data-service", address, "--json"])
    captured = capsys.readouterr()
    assert code == program.BAD_SETTINGS and "bad tf.data service address" in captured.err
    assert SECRET not in captured.err + captured.out and captured.err.count("\n") == 1
    assert SECRET not in last_json(captured.out)["error"]


def test_a_data_service_worker_refuses_a_dispatcher_address_without_echoing_its_password(capsys):
    from components.train import data_service

    code = data_service.run(["worker", "--dispatcher", "grpc://u:hunter2@h:5050", "--json"])
    captured = capsys.readouterr()
    assert code == program.FAILED and "--dispatcher: bad tf.data service address" in captured.err
    assert SECRET not in captured.err + captured.out


@pytest.mark.parametrize("flag", ["source", "--root"])
def test_ingest_errors_echo_bucket_uris_without_their_password(flag, tmp_path, capsys):
    from beam_jobs.ingest import run

    given = "memory://u:hunter2@nowhere/photos"
    argv = [given, "--root", str(tmp_path / "root")] if flag == "source" else [str(tmp_path), "--root", given]
    code = run([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 2 and "memory://u:***@nowhere" in captured.err, captured.err  # refused as a setting
    assert SECRET not in captured.err + captured.out


UNREADABLE_SOURCES = [f'http://alice:pa"s\'s {SECRET}@127.0.0.1:9/photos/m.csv', f"http://127.0.0.1:9/m.csv?pw={SECRET}",
                      f"http://127.0.0.1:9/m.csv?code={SECRET}&v=2", f"https://{SECRET}@127.0.0.1:9/m.csv",
                      f"HTTP://alice:{SECRET}@127.0.0.1:9/m.csv?X-Amz-Signature={SECRET}", f"ftp://alice:{SECRET}@127.0.0.1:9/m",
                      f"s3://alice:{SECRET}@bucket/photos", f"alice:{SECRET}@127.0.0.1:9/photos",
                      f"http://127.0.0.1:9/m.csv?hmac={SECRET}", f"http://127.0.0.1:9/m.csv?s=x&hdnts=acl=*~hmac={SECRET}",
                      f"http://127.0.0.1:9/m.csv#access_token={SECRET}", f"http://bob:2024;{SECRET}@127.0.0.1:9/m.csv"]


@pytest.mark.parametrize("source", UNREADABLE_SOURCES)
def test_a_source_that_cannot_be_read_is_echoed_without_its_credentials(source, tmp_path, capsys):
    from beam_jobs.ingest import run

    code = run([source, "--root", str(tmp_path / "root"), "--json"])
    captured = capsys.readouterr()
    # A scheme ingest does not read (ftp://) is refused as a setting; the others fail to be read.
    assert code in (program.BAD_SETTINGS, program.FAILED, program.TRANSIENT), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert SECRET not in captured.err + captured.out


def test_preflight_checks_a_source_without_echoing_its_credentials(tmp_path, capsys):
    from components.preflight import preflight

    preflight.run(["--source", UNREADABLE_SOURCES[0], "--root", str(tmp_path), "--sample-mb", "1", "--json"])
    captured = capsys.readouterr()
    assert "127.0.0.1:9" in captured.out and SECRET not in captured.err + captured.out


def test_a_stage_program_takes_the_source_its_file_holds_without_credentials_from_the_environment(tmp_path, monkeypatch,
                                                                                                   capsys):
    from beam_jobs.ingest import run

    real = f"http://alice:{SECRET}@127.0.0.1:9/photos/manifest.csv"
    settings = tmp_path / "ingest.json"
    settings.write_text(json.dumps({"source": without_secrets(real), "root": str(tmp_path / "root")}))
    parser = program.stage_parser("ingest", positional=("source",))
    monkeypatch.setenv(SOURCE_ENV, real)
    assert program.stage_config("ingest", parser.parse_args(["--config", str(settings)]))[0].source == real
    monkeypatch.setenv(SOURCE_ENV, real.replace("9/photos", "9/other"))  # another SOURCE's: not this one's
    assert run(["--config", str(settings), "--json"]) == program.BAD_SETTINGS
    captured = capsys.readouterr()
    assert SOURCE_ENV in captured.err and captured.err.count("\n") == 1 and SECRET not in captured.err + captured.out


def test_a_model_server_url_is_echoed_without_its_password(tmp_path, capsys):
    from components.push import predict
    from tests.beam_jobs import images

    image = tmp_path / "a.png"
    image.write_bytes(images.rgb_png())
    code = predict.run(["http://u:hunter2@127.0.0.1:9/v1/models/stoke", str(image), "--json"])
    captured = capsys.readouterr()
    assert code == 1 and "http://u:***@127.0.0.1:9" in captured.err, captured.err
    assert SECRET not in captured.err + captured.out


def test_every_program_hides_credentials_in_its_error_line_and_json(capsys):
    def work():
        raise ValueError("cannot open postgresql://u:hunter2@db/x?sslpassword=hunter2")

    assert program.main("stoke x", True, work, str, errors=(ValueError,)) == program.FAILED
    captured = capsys.readouterr()
    assert captured.err == "stoke x: error: cannot open postgresql://u:***@db/x?***\n"
    assert last_json(captured.out)["error"] == "cannot open postgresql://u:***@db/x?***"


def test_logs_through_the_escape_filter_hide_credentials(caplog):
    program.escape_logs("stoke.test.secrets")
    with caplog.at_level(logging.INFO, logger="stoke.test.secrets"):
        logging.getLogger("stoke.test.secrets").info("%s: %s", "ingest", "--root s3://k:hunter2@b/root")
    assert [r.getMessage() for r in caplog.records] == ["ingest: --root s3://k:***@b/root"]


def test_a_notifications_value_naming_no_queue_is_refused_without_its_password(capsys):
    from flows.work_pools import add_notifications_argument

    parser = argparse.ArgumentParser(prog="stoke deploy")
    add_notifications_argument(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--notifications", "sqs://u:hunter2@queue"])
    err = capsys.readouterr().err
    assert "expected sqs://QUEUE_NAME" in err and SECRET not in err and "sqs://u:***@queue" in err
