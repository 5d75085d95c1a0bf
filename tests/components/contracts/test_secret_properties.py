"""Credentials of every kind of character, drawn at random, never reach what Stoke shows or records: a URL's
user info is told by where it stands in the authority, whatever the password holds (digits first,
punctuation, spaces, `@`, `/`, `:`, percent-encoding, any script), and its query and fragment, whatever
they hold and however their parameters are named, are left out of what is recorded and hidden whole in text."""
import re

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from components.contracts.secrets import HIDDEN, SourceCredentials, recorded, without_secrets

SCHEMES = st.sampled_from(["http", "https", "HTTPS", "s3", "gs", "grpc", "ftp", "postgresql+asyncpg"])
PUNCTUATION = ";,)]('\"!$&*+=~^|\\<>[]{}`"
# Every class of character a password may hold, the awkward ones drawn often.
CHARACTERS = st.one_of(
    st.sampled_from("0123456789"), st.sampled_from(PUNCTUATION), st.sampled_from(" @/:?#%"),
    st.sampled_from(["%40", "%2F", "%3A", "%25", "%20"]),
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
)
TEXT = st.lists(CHARACTERS, max_size=24).map("".join)
AFTER = ("/photos/m.csv", "", ":9000", ":9000/photos/m.csv", "/a@2x.png")
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def in_authority(password: str) -> bool:
    """Whether a URL parser reads all of `password` as one: a port is digits that end the authority (then a
    path, query or fragment), an `@` ends the user info unless no `/`, `?` or `#` follows it, and `://`
    starts another URL."""
    head, at, tail = password.partition("@")
    return not re.match(r"\d{1,5}[/?#]", password) and "://" not in password and not (at and re.search("[/?#]", tail))


@PROPERTIES
@given(SCHEMES, TEXT.filter(in_authority), st.sampled_from(AFTER))
@example("http", "2024;Winter", "/photos/m.csv")
@example("https", "1234 x", ":9000/m.csv")
@example("s3", "p@ss w@rd", "/photos/m.csv")
def test_a_password_is_hidden_whatever_it_holds(scheme, password, after):
    url = f"{scheme}://bob:{password}@host.example{after}"
    kept = f"{scheme}://bob:***@host.example{after}"
    assert without_secrets(url) == kept
    assert without_secrets(f"cannot read '{url}': refused") == f"cannot read '{kept}': refused"
    credentials = SourceCredentials(url)
    assert credentials.given == f"{scheme}://bob:{password}@host.example{after.partition('/')[0]}"
    assert credentials.hide(url) == kept and credentials.reveal(kept) == url


@PROPERTIES
@given(TEXT.filter(lambda t: t and t != HIDDEN and not re.search(r"[\s/?#@:]", t)), SCHEMES)
@example('to"ke\'n;)', "https")
def test_a_token_as_the_user_is_hidden_whole(token, scheme):
    url = f"{scheme}://{token}@host.example/m.csv"
    assert without_secrets(url) == f"{scheme}://***@host.example/m.csv"
    assert SourceCredentials(url).given == f"{scheme}://{token}@host.example"


@PROPERTIES
@given(TEXT.filter(lambda t: in_authority(t) and not re.search(r"[\s/]", t)), st.sampled_from(("", ":5000")))
@example("2024;x", ":5000")
def test_a_password_without_a_scheme_is_hidden_up_to_the_end_of_its_token(password, port):
    """grpc's HOST:PORT spelling: a token without a scheme ends at a space or `/`."""
    assert without_secrets(f"bob:{password}@host{port}") == f"bob:***@host{port}"
    assert without_secrets(f"--dispatcher bob:{password}@host{port} --json") == f"--dispatcher bob:***@host{port} --json"


WEB = st.sampled_from(["http", "https", "HTTPS", "ftp", "webdav", "abfs", "grpc"])


@PROPERTIES
@given(WEB, st.sampled_from(["", "bob:2024;W x@", "tok@"]), st.sampled_from(["", ":9", ":9/m.csv", "/m.csv"]),
       st.sampled_from("?#"), TEXT, TEXT)
@example("https", "", "/m.csv", "?", "hmac=SIG", "")
@example("http", "bob:2024;W x@", ":9", "#", "access_token=SIG", "")
@example("https", "", "", "?", "url=https%3A%2F%2Fb%2Fk%3FX-Amz-Signature%3DSIG", "x#y")
def test_a_recorded_url_holds_nothing_of_its_query_or_fragment(scheme, user, after, mark, query, fragment):
    """SOURCE and its files as recorded: the URL up to its path, whatever follows."""
    url = f"{scheme}://{user}host.example{after}{mark}{query}#{fragment}"
    assert recorded(url) == f"{scheme}://{'***@' if user == 'tok@' else 'bob:***@' if user else ''}host.example{after}"


@PROPERTIES
@given(WEB, st.sampled_from("?#"), TEXT.filter(lambda t: not re.search(r"[\s'\"<>]", t)))
@example("https", "?", "s=IMGIX&hdnts=exp=9~acl=*~hmac=SIG")
def test_a_urls_query_or_fragment_in_text_is_hidden_whole(scheme, mark, query):
    """In a line (a log, an error): up to the end of the URL, a space, a quote or `<>`."""
    url = f"{scheme}://host.example/a/x.png{mark}{query}"
    if mark == "#" and re.fullmatch(r"row\d+", query):
        return  # a manifest's row, as ingest names it
    kept = f"{scheme}://host.example/a/x.png{mark}{HIDDEN}"
    assert without_secrets(f"cannot read {url} (403, url='{url}')") == f"cannot read {kept} (403, url='{kept}')"
