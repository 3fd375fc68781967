//! docs/api.md: the plegd.v1 API from proto/proto/plegd/v1/plegd.proto and its comments,
//! read from the descriptors protox compiles with source info.

use std::{collections::HashMap, fmt::Write as _, path::Path};

use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto,
    field_descriptor_proto::{Label, Type},
};

/// Field numbers of descriptor.proto, as source info paths use them.
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const FILE_SYNTAX: i32 = 12;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUM: i32 = 4;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

const PROTO: &str = "plegd/v1/plegd.proto";

/// Comments by source path.
struct Comments(HashMap<Vec<i32>, (String, Vec<String>)>);

impl Comments {
    fn new(file: &FileDescriptorProto) -> Self {
        let locations = file
            .source_code_info
            .as_ref()
            .map_or(&[][..], |i| &i.location);
        Self(
            locations
                .iter()
                .map(|l| {
                    let text = [l.leading_comments(), l.trailing_comments()]
                        .iter()
                        .map(|c| c.trim())
                        .filter(|c| !c.is_empty())
                        .collect::<Vec<_>>()
                        .join("\n\n");
                    (l.path.clone(), (text, l.leading_detached_comments.clone()))
                })
                .collect(),
        )
    }

    /// The comment of the element at `path`, paragraphs kept, lines joined.
    fn of(&self, path: &[i32]) -> String {
        self.0
            .get(path)
            .map(|(text, _)| paragraphs(text))
            .unwrap_or_default()
    }

    /// Comments before the element at `path`, separated from it by a blank line.
    fn detached(&self, path: &[i32]) -> Vec<String> {
        self.0
            .get(path)
            .map(|(_, detached)| detached.iter().map(|c| paragraphs(c)).collect())
            .unwrap_or_default()
    }
}

/// `text` with each paragraph on one line.
fn paragraphs(text: &str) -> String {
    text.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// A type name as the page writes it: a link for plegd.v1's own types.
fn type_link(name: &str) -> String {
    match name.strip_prefix(".plegd.v1.") {
        Some(local) => format!("[`{local}`](#{})", crate::links::anchor(local)),
        None => format!("`{}`", name.trim_start_matches('.')),
    }
}

fn scalar(t: Type) -> &'static str {
    match t {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group | Type::Message | Type::Enum => "",
    }
}

/// A field's type as written in the .proto: `repeated`, `optional` and `map<K, V>` included.
fn field_type(field: &FieldDescriptorProto, message: &DescriptorProto) -> String {
    let base = |f: &FieldDescriptorProto| match f.r#type() {
        Type::Message | Type::Enum | Type::Group => type_link(f.type_name()),
        t => format!("`{}`", scalar(t)),
    };
    if field.r#type() == Type::Message {
        let entry = field.type_name().rsplit('.').next().unwrap_or_default();
        if let Some(map) = message
            .nested_type
            .iter()
            .find(|n| n.name() == entry && n.options.as_ref().is_some_and(|o| o.map_entry()))
        {
            return format!("map<{}, {}>", base(&map.field[0]), base(&map.field[1]));
        }
    }
    match (field.label(), field.proto3_optional()) {
        (Label::Repeated, _) => format!("repeated {}", base(field)),
        (_, true) => format!("optional {}", base(field)),
        _ => base(field),
    }
}

fn write_enum(
    out: &mut String,
    name: &str,
    e: &EnumDescriptorProto,
    path: &[i32],
    comments: &Comments,
) {
    let _ = write!(out, "\n### `{name}`\n\n(enum) {}\n\n", comments.of(path));
    out.push_str("| Value | Number | Description |\n|---|---|---|\n");
    for (j, value) in e.value.iter().enumerate() {
        let value_path = [path, &[ENUM_VALUE, j as i32]].concat();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            value.name(),
            value.number(),
            super::cell(&comments.of(&value_path))
        );
    }
}

fn write_message(
    out: &mut String,
    name: &str,
    message: &DescriptorProto,
    path: &[i32],
    comments: &Comments,
) {
    let _ = write!(out, "\n### `{name}`\n\n");
    let about = comments.of(path);
    if !about.is_empty() {
        let _ = write!(out, "{about}\n\n");
    }
    if message.field.is_empty() {
        out.push_str("No fields.\n");
    } else {
        out.push_str("| Field | Type | Number | Description |\n|---|---|---|---|\n");
        for (j, field) in message.field.iter().enumerate() {
            let field_path = [path, &[MESSAGE_FIELD, j as i32]].concat();
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                field.name(),
                field_type(field, message),
                field.number(),
                super::cell(&comments.of(&field_path))
            );
        }
    }
    for (k, nested) in message.nested_type.iter().enumerate() {
        if !nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            let nested_path = [path, &[MESSAGE_NESTED, k as i32]].concat();
            write_message(
                out,
                &format!("{name}.{}", nested.name()),
                nested,
                &nested_path,
                comments,
            );
        }
    }
    for (k, e) in message.enum_type.iter().enumerate() {
        let enum_path = [path, &[MESSAGE_ENUM, k as i32]].concat();
        write_enum(
            out,
            &format!("{name}.{}", e.name()),
            e,
            &enum_path,
            comments,
        );
    }
}

pub fn reference() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let mut compiler = protox::Compiler::new([&root]).unwrap();
    compiler.include_source_info(true);
    compiler.open_file(PROTO).unwrap();
    let set = compiler.file_descriptor_set();
    let file = set
        .file
        .iter()
        .find(|f| f.name() == PROTO)
        .expect("plegd.proto");
    let comments = Comments::new(file);

    let mut out = super::banner("proto/proto/plegd/v1/plegd.proto and its comments");
    let _ = write!(out, "\n# `{}` API\n\n", file.package());
    // The file's own comment sits above `syntax`.
    let mut intro = comments.detached(&[FILE_SYNTAX]);
    intro.push(comments.of(&[FILE_SYNTAX]));
    for paragraph in intro.iter().filter(|p| !p.is_empty()) {
        let _ = write!(out, "{paragraph}\n\n");
    }
    out.push_str(
        "Clients in other languages: generate stubs from the .proto (it imports only \
         `google/protobuf/timestamp.proto`). See README, \"Clients in other languages\", for \
         connecting over the unix socket.\n",
    );
    for (i, service) in file.service.iter().enumerate() {
        let path = [FILE_SERVICE, i as i32];
        let _ = write!(
            out,
            "\n## Service `{}.{}`\n\n{}\n",
            file.package(),
            service.name(),
            comments.of(&path)
        );
        for (j, method) in service.method.iter().enumerate() {
            let stream = |yes: bool| if yes { "stream " } else { "" };
            let _ = write!(
                out,
                "\n### `{}`\n\n`rpc {}({}{}) returns ({}{})`\n\n{}\n",
                method.name(),
                method.name(),
                stream(method.client_streaming()),
                method.input_type().trim_start_matches(".plegd.v1."),
                stream(method.server_streaming()),
                method.output_type().trim_start_matches(".plegd.v1."),
                comments.of(&[FILE_SERVICE, i as i32, SERVICE_METHOD, j as i32]),
            );
        }
    }
    out.push_str("\n## Messages\n");
    for (i, message) in file.message_type.iter().enumerate() {
        write_message(
            &mut out,
            message.name(),
            message,
            &[FILE_MESSAGE, i as i32],
            &comments,
        );
    }
    out.push_str("\n## Enums\n");
    for (i, e) in file.enum_type.iter().enumerate() {
        write_enum(&mut out, e.name(), e, &[FILE_ENUM, i as i32], &comments);
    }
    out
}
