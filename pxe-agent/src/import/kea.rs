//! Kea configuration (JSON with Kea's comments) -> [`Translation`]. Owns
//! the comment stripping, the telling apart of `Dhcp4` and `Dhcp6`
//! configurations, the reading of `subnet4`, pools, reservations (per
//! subnet and global), `option-data` and `client-classes`, and a small
//! evaluator of the class `test` expressions Kea's documentation uses for
//! PXE (option 93, 60, 77 and 175 tests, `member`, `and`/`or`/`not`), run
//! for each firmware class so that every host gets the boot file Kea would
//! have sent. `Dhcp6` is read in `dhcp6`. Anything else is reported with
//! its file and line.

mod dhcp6;

use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::{
    BootSet, HostOut, ImportError, Imported, Origin, Report, SubnetOut, Translation, option_yaml,
    parse_cidr, valid_hostname,
};
use crate::mac::MacAddr;

/// Imports Kea configuration files: a kea-dhcp4 one, a kea-dhcp6 one, or
/// both (or one file holding both objects), whose reservations join into
/// hosts by MAC.
pub fn import(paths: &[PathBuf]) -> Result<Imported, ImportError> {
    let mut files = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
            path: path.clone(),
            source,
        })?;
        files.push((path.clone(), text));
    }
    translate_files(&files)?.finish()
}

/// Translates Kea configuration files (path and text): each holds a
/// `Dhcp4` or a `Dhcp6` object or both, and each kind may come once.
pub fn translate_files(files: &[(PathBuf, String)]) -> Result<Translation, ImportError> {
    let mut out = Translation::default();
    let mut sources = Vec::new();
    let mut first: [Option<&Path>; 2] = [None, None];
    for (path, text) in files {
        let (root, lines) = parse(path, text)?;
        let objects = [("Dhcp4", root.get("Dhcp4")), ("Dhcp6", root.get("Dhcp6"))];
        if objects.iter().all(|(_, o)| o.is_none()) {
            return Err(ImportError::Parse {
                origin: Origin::new(path, 1),
                message: "no Dhcp4 or Dhcp6 object".into(),
            });
        }
        for (kind, (name, object)) in objects.into_iter().enumerate() {
            let Some(object) = object else {
                continue;
            };
            let ctx = Ctx::new(path, lines.clone(), name);
            if let Some(earlier) = first[kind].replace(path) {
                return Err(ImportError::Parse {
                    origin: ctx.origin(name),
                    message: format!(
                        "a second {name} configuration (the first is in {}): give one kea-dhcp4 and one kea-dhcp6 configuration at most",
                        earlier.display()
                    ),
                });
            }
            let part = if kind == 0 {
                sources.push(format!("kea-dhcp4 {}", path.display()));
                translate4(ctx, object)
            } else {
                sources.push(format!("kea-dhcp6 {}", path.display()));
                dhcp6::translate(ctx, object)
            };
            out.subnets.extend(part.subnets);
            out.subnets6.extend(part.subnets6);
            out.hosts.extend(part.hosts);
            out.reservations6.extend(part.reservations6);
            out.report.items.extend(part.report.items);
            // `interfaces-config.interfaces`: `eth1`, or in Dhcp4
            // `eth1/ADDR` for one address of it, the agent's `eth1=ADDR`
            // (Dhcp6's unicast address is not the agent's to take).
            let interfaces = object
                .pointer("/interfaces-config/interfaces")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|i| *i != "*");
            for i in interfaces {
                let name = match i.split_once('/') {
                    Some((name, addr)) if kind == 0 => format!("{name}={addr}"),
                    Some((name, _)) => name.to_owned(),
                    None => i.to_owned(),
                };
                out.run_flags.add_interface(name);
            }
        }
    }
    out.source = sources.join(", ");
    Ok(out)
}

/// The JSON of `source` without comments, and the lines of its strings.
fn parse(file: &Path, source: &str) -> Result<(Value, HashMap<String, Vec<usize>>), ImportError> {
    let (json, lines) = strip_comments(source);
    let root = serde_json::from_str(&json).map_err(|e| ImportError::Parse {
        origin: Origin::new(file, e.line()),
        message: e.to_string(),
    })?;
    Ok((root, lines))
}

/// Kea's JSON without its comments (`//`, `#` and `/* */` outside strings;
/// line breaks are kept so that parser positions stay right), and the lines
/// of every string literal.
fn strip_comments(text: &str) -> (String, HashMap<String, Vec<usize>>) {
    let mut out = String::with_capacity(text.len());
    let mut lines = HashMap::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push(c);
                let mut lit = String::new();
                while let Some(c) = chars.next() {
                    out.push(c);
                    match c {
                        '\\' => {
                            if let Some(n) = chars.next() {
                                out.push(n);
                                lit.push(n);
                            }
                        }
                        '"' => break,
                        '\n' => {
                            line += 1;
                            lit.push(c);
                        }
                        c => lit.push(c),
                    }
                }
                lines.entry(lit).or_insert_with(Vec::new).push(line);
            }
            '#' => skip_line(&mut chars, &mut out, &mut line),
            '/' if chars.peek() == Some(&'/') => skip_line(&mut chars, &mut out, &mut line),
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        line += 1;
                    }
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '\n' => {
                line += 1;
                out.push(c);
            }
            c => out.push(c),
        }
    }
    (out, lines)
}

fn skip_line(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    out: &mut String,
    line: &mut usize,
) {
    for c in chars.by_ref() {
        if c == '\n' {
            out.push('\n');
            *line += 1;
            break;
        }
    }
}

/// A request kind the class tests are evaluated for.
#[derive(Debug, Clone, Copy)]
struct Probe {
    arch: u16,
    ipxe: bool,
}

impl Probe {
    /// Option 60 as the firmware sends it.
    fn vendor(self) -> String {
        if self.arch == 16 {
            "HTTPClient:Arch:00016:UNDI:003001".into()
        } else {
            format!("PXEClient:Arch:{:05}:UNDI:003016", self.arch)
        }
    }
}

#[derive(Debug)]
struct Class {
    name: String,
    test: Option<Expr>,
    boot_file: Option<String>,
    /// Its `option-data` the inventory takes: code -> YAML text.
    options: BTreeMap<u8, String>,
}

#[derive(Debug, Clone)]
enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Eq(Val, Val),
    Exists(u8),
    Member(String),
}

#[derive(Debug, Clone)]
enum Val {
    Option(u8),
    Substring(Box<Val>, usize, Option<usize>),
    Lit(Vec<u8>),
}

/// Parses a class `test`; `Err` names the part that is not understood.
fn parse_expr(text: &str) -> Result<Expr, String> {
    let tokens = tokenize(text)?;
    let mut p = Parser { tokens, pos: 0 };
    let e = p.or()?;
    if p.pos != p.tokens.len() {
        return Err(format!("unexpected {:?}", p.tokens[p.pos]));
    }
    Ok(e)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Punct(char),
    EqEq,
}

fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '\'' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some(c) => s.push(c),
                    None => return Err("unterminated string".into()),
                }
            }
            out.push(Tok::Str(s));
        } else if c == '=' {
            chars.next();
            if chars.next() != Some('=') {
                return Err("'=' without '='".into());
            }
            out.push(Tok::EqEq);
        } else if "()[],".contains(c) {
            chars.next();
            out.push(Tok::Punct(c));
        } else if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            let mut w = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                    w.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(Tok::Word(w));
        } else {
            return Err(format!("unexpected {c:?}"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn expect(&mut self, t: Tok) -> Result<(), String> {
        match self.next() {
            Some(got) if got == t => Ok(()),
            got => Err(format!("expected {t:?}, got {got:?}")),
        }
    }

    fn word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while self.word("or") {
            self.pos += 1;
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.unary()?;
        while self.word("and") {
            self.pos += 1;
            e = Expr::And(Box::new(e), Box::new(self.unary()?));
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.word("not") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.peek() == Some(&Tok::Punct('(')) {
            self.pos += 1;
            let e = self.or()?;
            self.expect(Tok::Punct(')'))?;
            return Ok(e);
        }
        if self.word("member") {
            self.pos += 1;
            self.expect(Tok::Punct('('))?;
            let Some(Tok::Str(name)) = self.next() else {
                return Err("member() without a class name".into());
            };
            self.expect(Tok::Punct(')'))?;
            return Ok(Expr::Member(name));
        }
        // option[N].exists
        if self.word("option") {
            let save = self.pos;
            let code = self.option_code()?;
            if self.word(".exists") {
                self.pos += 1;
                return Ok(Expr::Exists(code));
            }
            self.pos = save;
        }
        let a = self.value()?;
        self.expect(Tok::EqEq)?;
        let b = self.value()?;
        Ok(Expr::Eq(a, b))
    }

    fn option_code(&mut self) -> Result<u8, String> {
        self.pos += 1;
        self.expect(Tok::Punct('['))?;
        let Some(Tok::Word(n)) = self.next() else {
            return Err("option[] without a code".into());
        };
        let code = n
            .parse()
            .map_err(|_| format!("option[{n}] is not a code"))?;
        self.expect(Tok::Punct(']'))?;
        Ok(code)
    }

    fn value(&mut self) -> Result<Val, String> {
        match self.peek().cloned() {
            Some(Tok::Word(w)) if w == "option" => {
                let code = self.option_code()?;
                match self.next() {
                    Some(Tok::Word(s)) if s == ".hex" || s == ".text" => Ok(Val::Option(code)),
                    got => Err(format!("option[{code}] followed by {got:?}")),
                }
            }
            Some(Tok::Word(w)) if w == "substring" => {
                self.pos += 1;
                self.expect(Tok::Punct('('))?;
                let inner = self.value()?;
                self.expect(Tok::Punct(','))?;
                let start = self.number()?;
                self.expect(Tok::Punct(','))?;
                let len = match self.next() {
                    Some(Tok::Str(s)) if s == "all" => None,
                    Some(Tok::Word(n)) => Some(n.parse().map_err(|_| format!("length {n}"))?),
                    got => return Err(format!("substring length {got:?}")),
                };
                self.expect(Tok::Punct(')'))?;
                Ok(Val::Substring(Box::new(inner), start, len))
            }
            Some(Tok::Word(w)) if w.starts_with("0x") || w.starts_with("0X") => {
                self.pos += 1;
                let hex = &w[2..];
                let hex = if hex.len() % 2 == 1 {
                    format!("0{hex}")
                } else {
                    hex.to_string()
                };
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| format!("{w} is not hex"))?;
                Ok(Val::Lit(bytes))
            }
            Some(Tok::Str(s)) => {
                self.pos += 1;
                Ok(Val::Lit(s.into_bytes()))
            }
            got => Err(format!("{got:?} not supported")),
        }
    }

    fn number(&mut self) -> Result<usize, String> {
        match self.next() {
            Some(Tok::Word(n)) => n.parse().map_err(|_| format!("{n} is not a number")),
            got => Err(format!("expected a number, got {got:?}")),
        }
    }
}

/// The value of option `code` in `probe`'s request; empty when absent.
fn option_bytes(code: u8, probe: Probe) -> Vec<u8> {
    match code {
        93 => probe.arch.to_be_bytes().to_vec(),
        60 => probe.vendor().into_bytes(),
        77 if probe.ipxe => b"iPXE".to_vec(),
        175 if probe.ipxe => vec![19, 1, 1],
        _ => Vec::new(),
    }
}

fn eval_val(v: &Val, probe: Probe) -> Vec<u8> {
    match v {
        Val::Option(code) => option_bytes(*code, probe),
        Val::Lit(b) => b.clone(),
        Val::Substring(inner, start, len) => {
            let b = eval_val(inner, probe);
            let start = (*start).min(b.len());
            let end = len.map_or(b.len(), |l| (start + l).min(b.len()));
            b[start..end].to_vec()
        }
    }
}

fn eval(e: &Expr, probe: Probe, member: &dyn Fn(&str) -> bool) -> bool {
    match e {
        Expr::And(a, b) => eval(a, probe, member) && eval(b, probe, member),
        Expr::Or(a, b) => eval(a, probe, member) || eval(b, probe, member),
        Expr::Not(a) => !eval(a, probe, member),
        Expr::Eq(a, b) => eval_val(a, probe) == eval_val(b, probe),
        Expr::Exists(code) => !option_bytes(*code, probe).is_empty(),
        Expr::Member(name) => member(name),
    }
}

struct Ctx<'a> {
    file: &'a Path,
    lines: HashMap<String, Vec<usize>>,
    /// The line of the `Dhcp4` or `Dhcp6` key, where lookups start: a file
    /// may hold both objects.
    base: usize,
    report: Report,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a Path, lines: HashMap<String, Vec<usize>>, object: &str) -> Ctx<'a> {
        let base = lines
            .get(object)
            .and_then(|l| l.first().copied())
            .unwrap_or(1);
        Ctx {
            file,
            lines,
            base,
            report: Report::default(),
        }
    }

    /// The line of the string literal `value`: its first occurrence in the
    /// object read, else the object's first line. Values that repeat are
    /// looked up with [`Ctx::origin_after`].
    fn origin(&self, value: &str) -> Origin {
        self.origin_after(value, self.base)
    }

    /// The first line of `key` in the object read, else its first line.
    fn key_line(&self, key: &str) -> usize {
        self.origin(key).line
    }

    /// The first occurrence of `value` at or after line `base` (the line
    /// of the object it belongs to), else `base`.
    fn origin_after(&self, value: &str, base: usize) -> Origin {
        let line = self
            .lines
            .get(value)
            .and_then(|ls| ls.iter().copied().find(|l| *l >= base))
            .unwrap_or(base);
        Origin::new(self.file, line)
    }
}

fn text<'v>(obj: &'v Value, key: &str) -> Option<&'v str> {
    obj.get(key).and_then(Value::as_str)
}

/// The boot file a class or reservation sets: option 67 in its
/// `option-data`, else its `boot-file-name`.
fn boot_file(obj: &Value) -> Option<String> {
    let from_option = obj
        .get("option-data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|o| {
            text(o, "name") == Some("boot-file-name") || o.get("code") == Some(&Value::from(67))
        })
        .and_then(|o| text(o, "data"));
    from_option
        .or_else(|| text(obj, "boot-file-name"))
        .filter(|f| !f.is_empty())
        .map(str::to_string)
}

/// Settings read from `option-data` (global, a subnet's, a class's or a
/// reservation's).
#[derive(Default, Clone)]
struct Net {
    router: Option<Ipv4Addr>,
    dns: Vec<Ipv4Addr>,
    domain: Option<String>,
    /// Other options the inventory takes: code -> YAML text.
    options: BTreeMap<u8, String>,
    /// The codes this level's own `option-data` set (not inherited).
    own: Vec<u8>,
}

/// An IPv4 option's code from its Kea name (Kea's list of standard DHCPv4
/// options), for the names a PXE network's configuration uses.
fn option_code(name: &str) -> Option<u8> {
    Some(match name {
        "subnet-mask" => 1,
        "time-offset" => 2,
        "routers" => 3,
        "time-servers" => 4,
        "name-servers" => 5,
        "domain-name-servers" => 6,
        "log-servers" => 7,
        "lpr-servers" => 9,
        "host-name" => 12,
        "boot-size" => 13,
        "domain-name" => 15,
        "swap-server" => 16,
        "root-path" => 17,
        "extensions-path" => 18,
        "ip-forwarding" => 19,
        "default-ip-ttl" => 23,
        "interface-mtu" => 26,
        "broadcast-address" => 28,
        "static-routes" => 33,
        "arp-cache-timeout" => 35,
        "default-tcp-ttl" => 37,
        "nis-domain" => 40,
        "nis-servers" => 41,
        "ntp-servers" => 42,
        "vendor-encapsulated-options" => 43,
        "netbios-name-servers" => 44,
        "netbios-node-type" => 46,
        "netbios-scope" => 47,
        "tftp-server-name" => 66,
        "boot-file-name" => 67,
        "smtp-server" => 69,
        "pop-server" => 70,
        "www-server" => 72,
        "classless-static-route" => 121,
        _ => return None,
    })
}

fn addrs(data: &str) -> Option<Vec<Ipv4Addr>> {
    data.split(',').map(|a| a.trim().parse().ok()).collect()
}

fn read_options(obj: &Value, net: &mut Net, ctx: &mut Ctx<'_>, what: &str, base: usize) {
    for o in obj
        .get("option-data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(o, "name");
        let code = o.get("code").and_then(Value::as_u64);
        let data = text(o, "data").unwrap_or("");
        // Option values repeat (one router for all); the option's name
        // narrows the search to its own entry.
        let from = name.map_or(base, |n| ctx.origin_after(n, base).line);
        let origin = ctx.origin_after(data, from);
        if let Some(space) = text(o, "space").filter(|s| *s != "dhcp4") {
            ctx.report.add(
                &origin,
                format!("{what} option {data:?} in space {space} not translated: only standard options are"),
            );
            continue;
        }
        let number = match (name, code) {
            (_, Some(code)) => u8::try_from(code).ok(),
            (Some(name), None) => option_code(name),
            (None, None) => None,
        };
        let shown = name.map_or_else(|| code.unwrap_or(0).to_string(), str::to_string);
        let Some(number) = number else {
            ctx.report.add(
                &origin,
                format!("{what} option {shown} = {data:?} not translated: not an option the import knows by name; give its code"),
            );
            continue;
        };
        net.own.push(number);
        match number {
            3 => match addrs(data) {
                Some(a) if !a.is_empty() => net.router = Some(a[0]),
                _ => ctx
                    .report
                    .add(&origin, format!("{what} routers {data:?} not translated")),
            },
            6 => match addrs(data) {
                Some(a) => net.dns = a,
                None => ctx.report.add(
                    &origin,
                    format!("{what} domain-name-servers {data:?} not translated"),
                ),
            },
            15 => net.domain = Some(data.to_string()),
            67 => {}
            _ => {
                // `csv-format: false`: the data is hex digits.
                let hex = o.get("csv-format") == Some(&Value::Bool(false));
                let value = if hex {
                    let digits: String = data
                        .chars()
                        .filter(|c| !c.is_whitespace() && *c != ':')
                        .collect();
                    option_yaml(number, &[&format!("hex:{digits}")])
                } else {
                    let items: Vec<&str> = data.split(',').map(str::trim).collect();
                    option_yaml(number, &items)
                };
                match value {
                    Ok(yaml) => {
                        net.options.insert(number, yaml);
                    }
                    Err(why) => ctx.report.add(
                        &origin,
                        format!("{what} option {shown} = {data:?} not translated: {why}"),
                    ),
                }
            }
        }
    }
}

fn pool_range(text: &str) -> Option<(Ipv4Addr, Ipv4Addr)> {
    if let Some((a, b)) = text.split_once('-') {
        return Some((a.trim().parse().ok()?, b.trim().parse().ok()?));
    }
    let (net, len) = parse_cidr(text)?;
    let size = if len == 0 {
        u32::MAX
    } else {
        (1u32 << (32 - u32::from(len))) - 1
    };
    Some((net, Ipv4Addr::from(u32::from(net) | size)))
}

/// A reservation's own classes, its own boot file and its subnet: all the
/// boot answer depends on besides the request.
type CacheKey = (Vec<String>, Option<String>, Option<usize>);

/// Translates the kea-dhcp4 configuration `source` read from `file`.
pub fn translate(file: &Path, source: &str) -> Result<Translation, ImportError> {
    let (root, lines) = parse(file, source)?;
    let Some(dhcp4) = root.get("Dhcp4") else {
        return Err(ImportError::Parse {
            origin: Origin::new(file, 1),
            message: "no Dhcp4 object".into(),
        });
    };
    let mut t = translate4(Ctx::new(file, lines, "Dhcp4"), dhcp4);
    t.source = format!("kea-dhcp4 {}", file.display());
    Ok(t)
}

/// The translation of a `Dhcp4` object.
fn translate4(mut ctx: Ctx<'_>, dhcp4: &Value) -> Translation {
    let file = ctx.file;
    let mut global = Net::default();
    let base = ctx.base;
    read_options(dhcp4, &mut global, &mut ctx, "global", base);
    let global_lease = dhcp4.get("valid-lifetime").and_then(Value::as_u64);
    let global_boot = boot_file(dhcp4);
    for (key, why) in [
        ("hooks-libraries", "hook libraries can change any answer"),
        ("option-def", "custom option definitions"),
        ("next-server", "the agent names itself as the TFTP server"),
    ] {
        if dhcp4.get(key).is_some() {
            ctx.report.add(
                &Origin::new(file, ctx.key_line(key)),
                format!("{key} not translated: {why}"),
            );
        }
    }
    if dhcp4.get("shared-networks").is_some() {
        ctx.report.add(
            &Origin::new(file, ctx.key_line("shared-networks")),
            "shared-networks not translated: move their subnet4 entries to the top level",
        );
    }

    let mut classes = Vec::new();
    for c in dhcp4
        .get("client-classes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(c, "name").unwrap_or("").to_string();
        let origin = ctx.origin(&name);
        let test = match text(c, "test") {
            Some(t) => match parse_expr(t) {
                Ok(e) => Some(e),
                Err(why) => {
                    ctx.report.add(
                        &origin,
                        format!("class {name} test {t:?} not translated ({why}): the class is taken as never matching"),
                    );
                    Some(Expr::Member("\0never".into()))
                }
            },
            None => None,
        };
        if c.get("next-server").is_some() || c.get("server-hostname").is_some() {
            ctx.report.add(
                &origin,
                format!("class {name} next-server/server-hostname not translated: the agent names itself as the TFTP server"),
            );
        }
        if c.get("only-if-required").is_some() || c.get("only-in-additional-list").is_some() {
            ctx.report.add(
                &origin,
                format!("class {name} is evaluated only when required: taken as never matching"),
            );
            continue;
        }
        let mut own = Net::default();
        read_options(c, &mut own, &mut ctx, &format!("class {name}"), origin.line);
        classes.push(Class {
            name,
            test,
            boot_file: boot_file(c),
            options: all_options(own),
        });
    }

    let mut subnets = Vec::new();
    let mut subnet_boot = Vec::new();
    // The codes each subnet's own option-data sets: in Kea they win over
    // a class's.
    let mut subnet_own: Vec<Vec<u8>> = Vec::new();
    let mut reservations: Vec<(&Value, Option<usize>)> = Vec::new();
    for s in dhcp4
        .get("subnet4")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let cidr = text(s, "subnet").unwrap_or("");
        let origin = ctx.origin(cidr);
        let Some((network, prefix)) = parse_cidr(cidr) else {
            ctx.report.add(
                &origin,
                format!("subnet {cidr:?} not translated: not a network/prefix"),
            );
            continue;
        };
        let mut net = global.clone();
        net.own.clear();
        read_options(
            s,
            &mut net,
            &mut ctx,
            &format!("subnet {cidr}"),
            origin.line,
        );
        if s.get("client-class").is_some() || s.get("client-classes").is_some() {
            ctx.report.add(
                &origin,
                format!("subnet {cidr} restricted to client classes: the agent serves it to every client"),
            );
        }
        if s.get("next-server").is_some() {
            ctx.report.add(
                &origin,
                format!("subnet {cidr} next-server not translated: the agent names itself as the TFTP server"),
            );
        }
        let mut pool = None;
        for (i, p) in s
            .get("pools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let range = text(p, "pool").unwrap_or("");
            match pool_range(range) {
                Some(r) if i == 0 => pool = Some(r),
                Some(_) => ctx.report.add(
                    &ctx.origin_after(range, origin.line),
                    format!("pool {range} not translated: the inventory keeps one pool a subnet"),
                ),
                None => ctx.report.add(
                    &ctx.origin_after(range, origin.line),
                    format!("pool {range:?} not understood"),
                ),
            }
        }
        if pool.is_some() {
            ctx.report.add(
                &origin,
                "pool kept, used only with discovery on: Kea leased it to every unknown machine",
            );
        }
        let idx = subnets.len();
        subnets.push(SubnetOut {
            network,
            prefix,
            router: net.router,
            dns: net.dns,
            domain: net.domain,
            lease_time: s
                .get("valid-lifetime")
                .and_then(Value::as_u64)
                .or(global_lease)
                .and_then(|l| u32::try_from(l).ok()),
            pool,
            proxy: false,
            options: net.options,
            origin,
        });
        subnet_own.push(net.own);
        subnet_boot.push(boot_file(s).or_else(|| global_boot.clone()));
        for r in s
            .get("reservations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            reservations.push((r, Some(idx)));
        }
    }
    for r in dhcp4
        .get("reservations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        reservations.push((r, None));
    }

    let probes = |arch, ipxe| Probe { arch, ipxe };
    // Class memberships and boot files depend only on the reservation's own
    // classes and the subnet: evaluate once per distinct pair.
    let mut cache: BTreeMap<CacheKey, BootSet> = BTreeMap::new();
    let mut hosts = Vec::new();
    for (r, subnet) in reservations {
        let id = text(r, "hw-address");
        let Some(mac_text) = id else {
            let other = ["client-id", "duid", "circuit-id", "flex-id"]
                .into_iter()
                .find(|k| r.get(*k).is_some())
                .unwrap_or("no identifier");
            let value = text(r, other).unwrap_or("");
            ctx.report.add(
                &ctx.origin(value),
                format!("reservation by {other} {value} left out: the inventory matches MACs only"),
            );
            continue;
        };
        let origin = ctx.origin(mac_text);
        let Ok(mac) = mac_text.parse::<MacAddr>() else {
            ctx.report.add(
                &origin,
                format!("reservation hw-address {mac_text:?} not understood"),
            );
            continue;
        };
        let Some(ip) = text(r, "ip-address").and_then(|a| a.parse::<Ipv4Addr>().ok()) else {
            ctx.report.add(
                &origin,
                format!(
                    "reservation {mac} left out: no ip-address (Kea leased it one from a pool)"
                ),
            );
            continue;
        };
        let subnet = subnet.or_else(|| subnets.iter().position(|s| s.contains(ip)));
        let mut hostname = text(r, "hostname").map(str::to_string);
        if let Some(name) = &hostname
            && !valid_hostname(name)
        {
            ctx.report.add(
                &origin,
                format!("hostname {name:?} not translated: the inventory takes letters, digits, '-' and '.', at most 63 bytes"),
            );
            hostname = None;
        }
        if r.get("next-server").is_some() || r.get("server-hostname").is_some() {
            ctx.report.add(
                &origin,
                "next-server/server-hostname not translated: the agent names itself as the TFTP server",
            );
        }
        let mut own_options = Net::default();
        read_options(
            r,
            &mut own_options,
            &mut ctx,
            &format!("reservation {mac}"),
            origin.line,
        );
        let own: Vec<String> = r
            .get("client-classes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str().map(str::to_string))
            .collect();
        let key = (own.clone(), boot_file(r), subnet);
        let boot = match cache.get(&key) {
            Some(b) => b.clone(),
            None => {
                let file = |probe: Probe| -> Option<String> {
                    if let Some(f) = &key.1 {
                        return Some(f.clone());
                    }
                    members(&classes, &own, probe)
                        .iter()
                        .find_map(|c| c.boot_file.clone())
                        .or_else(|| subnet.and_then(|s| subnet_boot[s].clone()))
                };
                let mut b = boot_set(&file, probes, &mut ctx.report, &origin);
                let own_codes = subnet.map_or(&[][..], |s| subnet_own[s].as_slice());
                b.options = class_options(&classes, &own, own_codes, &mut ctx.report, &origin);
                cache.insert(key.clone(), b.clone());
                b
            }
        };
        hosts.push(HostOut {
            mac,
            macs: vec![mac],
            ip: Some(ip),
            hostname,
            boot,
            options: all_options(own_options),
            ipv6: None,
            uuid: None,
            origin,
            origin6: None,
        });
    }
    Translation {
        source: format!("kea-dhcp4 {}", file.display()),
        subnets,
        hosts,
        report: ctx.report,
        ..Translation::default()
    }
}

/// The classes a reservation with classes `own` is a member of for
/// `probe`, in definition order (a test may name a class defined before
/// it).
fn members<'c>(classes: &'c [Class], own: &[String], probe: Probe) -> Vec<&'c Class> {
    let mut member: Vec<&str> = own.iter().map(String::as_str).collect();
    let mut hits = Vec::new();
    for c in classes {
        let hit = match &c.test {
            Some(t) => eval(t, probe, &|n| member.contains(&n)),
            None => own.contains(&c.name),
        };
        if hit {
            member.push(&c.name);
            hits.push(c);
        }
    }
    hits
}

/// The requests a reservation's class options are judged over: each
/// firmware class the boot files are read for, iPXE or not.
const CLASS_PROBES: [(u16, bool); 7] = [
    (0, false),
    (7, false),
    (9, false),
    (11, false),
    (16, false),
    (0, true),
    (7, true),
];

/// The options of the classes a reservation with classes `own` is a
/// member of for every request, as its profile's `options`: the first
/// class that sets a code wins, as in Kea, and a code its subnet's own
/// `option-data` sets is the subnet's (Kea puts a subnet's options before
/// a class's). A class a host is a member of for some requests only
/// depends on the request, which profile options cannot: reported.
fn class_options(
    classes: &[Class],
    own: &[String],
    subnet_codes: &[u8],
    report: &mut Report,
    origin: &Origin,
) -> BTreeMap<u8, String> {
    let per_probe: Vec<Vec<&str>> = CLASS_PROBES
        .iter()
        .map(|&(arch, ipxe)| {
            members(classes, own, Probe { arch, ipxe })
                .iter()
                .map(|c| c.name.as_str())
                .collect()
        })
        .collect();
    let mut out = BTreeMap::new();
    for c in classes.iter().filter(|c| !c.options.is_empty()) {
        let hits = per_probe
            .iter()
            .filter(|m| m.contains(&c.name.as_str()))
            .count();
        if hits == 0 {
            continue;
        }
        if hits < per_probe.len() {
            report.add(
                origin,
                format!("class {} option-data not translated: the class holds some of this host's requests only (its test reads the request), and a profile's options go to all of them", c.name),
            );
            continue;
        }
        for (code, value) in &c.options {
            if subnet_codes.contains(code) {
                report.add(
                    origin,
                    format!("class {} option {code} left out: the subnet's own option {code} wins over a class's in Kea", c.name),
                );
                continue;
            }
            out.entry(*code).or_insert_with(|| value.clone());
        }
    }
    out
}

/// Every option a level's `option-data` gave, the router, DNS servers and
/// domain name included, as `options`.
fn all_options(net: Net) -> BTreeMap<u8, String> {
    let mut out = net.options;
    let addresses = |a: &[Ipv4Addr]| a.iter().map(ToString::to_string).collect::<Vec<_>>();
    let fields = [
        (3, net.router.map(|r| addresses(&[r]))),
        (6, (!net.dns.is_empty()).then(|| addresses(&net.dns))),
        (15, net.domain.map(|d| vec![d])),
    ];
    for (code, items) in fields {
        if let Some(items) = items {
            let items: Vec<&str> = items.iter().map(String::as_str).collect();
            if let Ok(yaml) = option_yaml(code, &items) {
                out.insert(code, yaml);
            }
        }
    }
    out
}

fn boot_set(
    file: &dyn Fn(Probe) -> Option<String>,
    probe: impl Fn(u16, bool) -> Probe,
    report: &mut Report,
    origin: &Origin,
) -> BootSet {
    BootSet::from_probes(|arch, ipxe| file(probe(arch, ipxe)), report, origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEA: &str = r#"{
  // Kea allows comments of three kinds.
  "Dhcp4": {
    "interfaces-config": { "interfaces": ["eth0"] },
    "valid-lifetime": 3600,  # seconds
    /* PXE classes in the shape of Kea's documentation */
    "client-classes": [
      { "name": "ipxe", "test": "option[77].hex == 'iPXE'",
        "boot-file-name": "http://10.66.0.1:8080/boot.ipxe" },
      { "name": "uefi", "test": "option[93].hex == 0x0007 or option[93].hex == 0x0009",
        "boot-file-name": "ipxe.efi" },
      { "name": "legacy", "test": "substring(option[60].hex,0,20) == 'PXEClient:Arch:00000'",
        "boot-file-name": "undionly.kpxe", "next-server": "10.66.0.1" },
      { "name": "arm", "test": "option[93].hex == 0x000b and not member('ipxe')",
        "boot-file-name": "ipxe-arm64.efi" },
      { "name": "odd", "test": "pkt4.mac == 0x525400000001", "boot-file-name": "x" }
    ],
    "subnet4": [{
      "id": 1, "subnet": "10.66.0.0/16",
      "pools": [ { "pool": "10.66.200.1 - 10.66.200.250" } ],
      "option-data": [ { "name": "routers", "data": "10.66.0.1" },
                       { "name": "domain-name-servers", "data": "10.66.0.2, 10.66.0.3" },
                       { "name": "ntp-servers", "data": "10.66.0.1" } ],
      "reservations": [
        { "hw-address": "52:54:00:00:00:01", "ip-address": "10.66.1.1", "hostname": "n1" },
        { "hw-address": "52:54:00:00:00:02", "ip-address": "10.66.1.2",
          "boot-file-name": "special.efi" },
        { "client-id": "01:52:54:00:00:00:03", "ip-address": "10.66.1.3" },
        { "hw-address": "52:54:00:00:00:04" }
      ]
    }],
    "reservations": [ { "hw-address": "52:54:00:00:00:05", "ip-address": "10.66.1.5" } ]
  }
}"#;

    fn run() -> Translation {
        translate(Path::new("kea.json"), KEA).expect("translates")
    }

    #[test]
    fn the_interfaces_kea_served_become_run_flags() {
        let v4 = KEA.replace(r#"["eth0"]"#, r#"["eth0", "eth1/10.66.0.1"]"#);
        let v6 =
            r#"{"Dhcp6": {"interfaces-config": {"interfaces": ["eth1/2001:db8::1", "eth2"]}}}"#;
        let t = translate_files(&[
            (PathBuf::from("kea4.json"), v4),
            (PathBuf::from("kea6.json"), v6.to_owned()),
        ])
        .expect("translates");
        assert_eq!(
            t.run_flags.interfaces,
            ["eth0", "eth1=10.66.0.1", "eth1", "eth2"]
        );
    }

    #[test]
    fn comments_are_stripped_outside_strings_only() {
        let (json, _) = strip_comments("{\"a\": \"http://x/#y\", // c\n \"b\": 1 /* z */ }");
        let v: Value = serde_json::from_str(&json).expect("json");
        assert_eq!(v["a"], "http://x/#y");
        assert_eq!(v["b"], 1);
    }

    #[test]
    fn classes_pick_boot_files_per_firmware() {
        let t = run();
        assert_eq!(t.hosts.len(), 3);
        let h = &t.hosts[0];
        assert_eq!(h.hostname.as_deref(), Some("n1"));
        assert_eq!(h.boot.bios.as_deref(), Some("undionly.kpxe"));
        assert_eq!(h.boot.uefi.as_deref(), Some("ipxe.efi"));
        assert_eq!(h.boot.uefi_arm64.as_deref(), Some("ipxe-arm64.efi"));
        assert_eq!(
            h.boot.chain.as_deref(),
            Some("http://10.66.0.1:8080/boot.ipxe")
        );
        // A reservation's own boot file wins over the classes.
        assert_eq!(t.hosts[1].boot.bios.as_deref(), Some("special.efi"));
        // The global reservation lands in the subnet holding its address.
        assert_eq!(t.hosts[2].ip, Some(Ipv4Addr::new(10, 66, 1, 5)));
        let s = &t.subnets[0];
        assert_eq!(s.router, Some(Ipv4Addr::new(10, 66, 0, 1)));
        assert_eq!(s.dns.len(), 2);
        assert_eq!(s.lease_time, Some(3600));
    }

    #[test]
    fn class_tests_evaluate() {
        let p = |arch, ipxe| Probe { arch, ipxe };
        let none = |_: &str| false;
        for (test, probe, want) in [
            ("option[93].hex == 0x0007", p(7, false), true),
            ("option[93].hex == 0x0007", p(0, false), false),
            (
                "substring(option[60].hex,0,9) == 'PXEClient'",
                p(0, false),
                true,
            ),
            (
                "substring(option[60].hex,0,9) == 'PXEClient'",
                p(16, false),
                false,
            ),
            ("option[77].hex == 'iPXE'", p(7, true), true),
            ("option[175].exists", p(7, false), false),
            (
                "not (option[93].hex == 0x0000) and option[175].exists",
                p(7, true),
                true,
            ),
        ] {
            let e = parse_expr(test).expect(test);
            assert_eq!(eval(&e, probe, &none), want, "{test} for {probe:?}");
        }
        assert!(parse_expr("pkt4.mac == 0x01").is_err());
    }

    #[test]
    fn untranslated_items_are_reported_with_lines() {
        let r = run().report.to_string();
        for want in [
            "kea.json:16: class odd test",
            "kea.json:12: class legacy next-server",
            "kea.json:28: reservation by client-id",
            "kea.json:29: reservation 52:54:00:00:00:04 left out: no ip-address",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
    }

    #[test]
    fn subnet_option_data_becomes_subnet_options_and_class_option_data_profile_options() {
        let kea = r#"{"Dhcp4": {
  "client-classes": [
    { "name": "rack1", "option-data": [ { "name": "ntp-servers", "data": "10.66.0.8" },
                                       { "name": "domain-name", "data": "rack1.example" },
                                       { "code": 224, "data": "rack-1" } ] },
    { "name": "uefi", "test": "option[93].hex == 0x0007",
      "option-data": [ { "code": 225, "data": "uefi" } ] }
  ],
  "option-data": [ { "name": "interface-mtu", "data": "9000" } ],
  "subnet4": [{
    "subnet": "10.66.0.0/16",
    "option-data": [ { "name": "routers", "data": "10.66.0.1" },
                     { "name": "ntp-servers", "data": "10.66.0.4, 10.66.0.5" },
                     { "name": "tftp-server-name", "data": "tftp.lab.example" },
                     { "code": 43, "data": "06 01 08", "csv-format": false },
                     { "name": "time-offset", "data": "soon" } ],
    "reservations": [
      { "hw-address": "52:54:00:00:00:01", "ip-address": "10.66.1.1",
        "client-classes": ["rack1"],
        "option-data": [ { "name": "ntp-servers", "data": "10.66.0.9" } ] },
      { "hw-address": "52:54:00:00:00:02", "ip-address": "10.66.1.2" }
    ]
  }]
}}"#;
        let t = translate(Path::new("kea.json"), kea).expect("translates");
        let subnet = &t.subnets[0];
        assert_eq!(
            subnet.options,
            BTreeMap::from([
                (26, "9000".to_owned()),
                (42, r#"["10.66.0.4", "10.66.0.5"]"#.to_owned()),
                (43, r#""hex:060108""#.to_owned()),
                (66, r#""tftp.lab.example""#.to_owned()),
            ])
        );
        assert_eq!(subnet.router, Some([10, 66, 0, 1].into()));
        // rack1 holds the first host for every request: its profile's
        // options, but its 42, which the subnet's own wins over in Kea.
        let (one, two) = (&t.hosts[0], &t.hosts[1]);
        assert_eq!(
            one.boot.options,
            BTreeMap::from([
                (15, r#""rack1.example""#.to_owned()),
                (224, r#""rack-1""#.to_owned()),
            ])
        );
        assert!(two.boot.options.is_empty());
        assert_eq!(
            one.options,
            BTreeMap::from([(42, r#""10.66.0.9""#.to_owned())])
        );
        let r = t.report.to_string();
        for want in [
            "class rack1 option 42 left out: the subnet's own option 42 wins",
            "class uefi option-data not translated: the class holds some of this host's requests only",
            "option time-offset = \"soon\" not translated: option 2 (time offset)",
        ] {
            assert!(r.contains(want), "missing {want:?} in:\n{r}");
        }
        let imported = t.finish().expect("validates");
        let inv = crate::inventory::Inventory::parse(Path::new("i.yaml"), &imported.yaml)
            .expect("the agent's own validation");
        assert_eq!(
            inv.subnets[0].options[&42],
            vec![10, 66, 0, 4, 10, 66, 0, 5]
        );
        let host = inv
            .host_by_mac("52:54:00:00:00:01".parse().expect("mac"))
            .expect("host");
        assert_eq!(inv.profile_of(host).options[&224], b"rack-1".to_vec());
        assert_eq!(host.options.get(42), Some(&[10, 66, 0, 9][..]));
        let other = inv
            .host_by_mac("52:54:00:00:00:02".parse().expect("mac"))
            .expect("host");
        assert_ne!(host.profile, other.profile);
    }

    #[test]
    fn result_validates() {
        let imported = run().finish().expect("validates");
        assert!(
            imported
                .yaml
                .contains("chain: \"http://10.66.0.1:8080/boot.ipxe\"")
        );
    }
}
