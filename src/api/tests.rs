//! Pins the wire surface: every method, message, field number, type and label of the compiled
//! descriptor, as a reviewed snapshot, plus the numbers the spec calls out by name.

use std::fmt::Write as _;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorProto,
    FileDescriptorSet,
};

use super::{ERROR_DETAIL_TYPE_URL, FILE_DESCRIPTOR_SET, PACKAGE, SERVICE_NAME, pb};

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("build.rs writes a valid descriptor set")
}

fn our_file() -> FileDescriptorProto {
    descriptor_set()
        .file
        .into_iter()
        .find(|f| f.package() == PACKAGE)
        .expect("the descriptor set holds the execution API file")
}

fn message<'a>(file: &'a FileDescriptorProto, name: &str) -> &'a DescriptorProto {
    file.message_type
        .iter()
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("message {name} exists"))
}

fn field_number(file: &FileDescriptorProto, msg: &str, field: &str) -> i32 {
    message(file, msg)
        .field
        .iter()
        .find(|f| f.name() == field)
        .unwrap_or_else(|| panic!("field {msg}.{field} exists"))
        .number()
}

/// Strips our package prefix so the rendering stays short; foreign types keep their full name.
fn short_type_name(name: &str) -> &str {
    let ours = format!(".{PACKAGE}.");
    name.strip_prefix(ours.as_str())
        .map_or_else(|| name.trim_start_matches('.'), |_| &name[ours.len()..])
}

fn scalar_name(ty: Type) -> &'static str {
    match ty {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Group => "group",
        Type::Message => "message",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Enum => "enum",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
    }
}

fn type_text(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum => short_type_name(field.type_name()).to_owned(),
        other => scalar_name(other).to_owned(),
    }
}

/// The map entry type of `field`, if it is a map field of `msg`.
fn map_entry<'a>(
    msg: &'a DescriptorProto,
    field: &FieldDescriptorProto,
) -> Option<&'a DescriptorProto> {
    if field.label() != Label::Repeated || field.r#type() != Type::Message {
        return None;
    }
    let entry_name = field.type_name().rsplit('.').next()?;
    msg.nested_type
        .iter()
        .find(|n| n.name() == entry_name && n.options.as_ref().is_some_and(|o| o.map_entry()))
}

fn render_field(out: &mut String, msg: &DescriptorProto, field: &FieldDescriptorProto) {
    let ty = if let Some(entry) = map_entry(msg, field) {
        let key = entry.field.iter().find(|f| f.number() == 1).map(type_text);
        let value = entry.field.iter().find(|f| f.number() == 2).map(type_text);
        format!(
            "map<{}, {}>",
            key.unwrap_or_default(),
            value.unwrap_or_default()
        )
    } else {
        let label = match field.label() {
            Label::Repeated => "repeated ",
            _ if field.proto3_optional() => "optional ",
            _ => "",
        };
        format!("{label}{}", type_text(field))
    };
    writeln!(out, "  {:>2} {}: {ty}", field.number(), field.name()).expect("write to String");
}

fn render_message(out: &mut String, msg: &DescriptorProto) {
    writeln!(out, "message {}", msg.name()).expect("write to String");
    for field in &msg.field {
        render_field(out, msg, field);
    }
    for range in &msg.reserved_range {
        // Descriptor ranges are half-open.
        let (start, end) = (range.start(), range.end() - 1);
        if start == end {
            writeln!(out, "  reserved {start}").expect("write to String");
        } else {
            writeln!(out, "  reserved {start} to {end}").expect("write to String");
        }
    }
    for name in &msg.reserved_name {
        writeln!(out, "  reserved \"{name}\"").expect("write to String");
    }
}

fn render_enum(out: &mut String, e: &EnumDescriptorProto) {
    writeln!(out, "enum {}", e.name()).expect("write to String");
    for value in &e.value {
        writeln!(out, "  {:>2} {}", value.number(), value.name()).expect("write to String");
    }
}

/// A stable text rendering of the whole wire surface of our file.
fn render_wire_surface(file: &FileDescriptorProto) -> String {
    let mut out = String::new();
    writeln!(out, "package {}", file.package()).expect("write to String");
    for dep in &file.dependency {
        writeln!(out, "import {dep}").expect("write to String");
    }
    for service in &file.service {
        writeln!(out, "\nservice {}", service.name()).expect("write to String");
        for method in &service.method {
            let streaming = method.client_streaming() || method.server_streaming();
            writeln!(
                out,
                "  rpc {}({}) -> {}{}",
                method.name(),
                short_type_name(method.input_type()),
                short_type_name(method.output_type()),
                if streaming { " [streaming]" } else { "" },
            )
            .expect("write to String");
        }
    }
    for e in &file.enum_type {
        out.push('\n');
        render_enum(&mut out, e);
    }
    for msg in &file.message_type {
        out.push('\n');
        render_message(&mut out, msg);
    }
    out
}

#[test]
fn the_wire_surface_matches_the_reviewed_snapshot() {
    insta::assert_snapshot!("wire_surface", render_wire_surface(&our_file()));
}

#[test]
fn the_descriptor_set_carries_the_well_known_imports_for_reflection() {
    let names: Vec<String> = descriptor_set()
        .file
        .iter()
        .map(|f| f.name().to_owned())
        .collect();
    for wanted in [
        "google/protobuf/empty.proto",
        "google/protobuf/timestamp.proto",
        "mecatl/execution/v1/execution.proto",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing from {names:?}"
        );
    }
}

#[test]
fn the_field_numbers_the_spec_pins_are_exact() {
    let file = our_file();
    let pinned = [
        ("RequestContext", "grant", 5),
        ("RequestContext", "run_id", 6),
        ("RequestContext", "claim_id", 7),
        ("RequestContext", "grant_generation", 8),
        ("RunClaimResponse", "grant", 7),
        ("RunClaimResponse", "expires_at", 8),
        ("EnsureEnvironmentResponse", "grant_generation", 6),
        ("AttachEnvironmentResponse", "grant_generation", 6),
        ("RenewRunRequest", "grant_generation", 9),
        ("ReleaseRunRequest", "grant_generation", 8),
        ("FileRequest", "limit", 8),
        ("FileResponse", "authority_workspace", 8),
        ("CommandStatusResponse", "terminal_receipt", 8),
        ("CommandStartRequest", "detach", 4),
        ("CommandStartRequest", "pty", 8),
        ("CommandQueryRequest", "grace_millis", 5),
        ("CommandStatusResponse", "dropped_bytes", 9),
        ("CommandStatusResponse", "ended_at_unix_millis", 15),
        ("CommandOutputEvent", "dropped_bytes", 3),
        ("MigrateEnvironmentRequest", "expected_schema_version", 3),
        ("ErrorDetail", "code", 1),
        ("ErrorDetail", "retryable", 2),
    ];
    for (msg, field, number) in pinned {
        assert_eq!(field_number(&file, msg, field), number, "{msg}.{field}");
    }
}

#[test]
fn ensure_and_attach_responses_keep_the_old_grant_tags_reserved() {
    let file = our_file();
    for name in ["EnsureEnvironmentResponse", "AttachEnvironmentResponse"] {
        let msg = message(&file, name);
        assert!(msg.field.iter().all(|f| f.number() != 4 && f.number() != 5));
        // Descriptor ranges are half-open; flatten them into the reserved tag numbers.
        let reserved: Vec<i32> = msg
            .reserved_range
            .iter()
            .flat_map(|r| r.start()..r.end())
            .collect();
        assert_eq!(reserved, [4, 5], "{name} reserves tags 4 and 5");
        assert_eq!(msg.reserved_name, ["grant", "grant_expires_at"], "{name}");
    }
}

#[test]
fn migrate_expected_schema_version_has_explicit_presence() {
    let request = pb::MigrateEnvironmentRequest {
        expected_schema_version: Some(0),
        ..Default::default()
    };
    let decoded = pb::MigrateEnvironmentRequest::decode(request.encode_to_vec().as_slice())
        .expect("round trip");
    assert_eq!(decoded.expected_schema_version, Some(0));
    let absent = pb::MigrateEnvironmentRequest::decode(&[][..]).expect("empty decodes");
    assert_eq!(absent.expected_schema_version, None);
}

#[test]
fn the_service_is_named_as_the_spec_says() {
    let file = our_file();
    let service = file.service.first().expect("one service");
    assert_eq!(file.service.len(), 1);
    assert_eq!(format!("{PACKAGE}.{}", service.name()), SERVICE_NAME);
    assert_eq!(
        pb::execution_provider_service_server::SERVICE_NAME,
        SERVICE_NAME
    );
}

#[test]
fn error_detail_packs_under_its_type_url() {
    let any = pb::ErrorDetail::new("not_ready", true).to_any();
    assert_eq!(any.type_url, ERROR_DETAIL_TYPE_URL);
    let back = pb::ErrorDetail::decode(any.value.as_slice()).expect("decodes");
    assert_eq!(back, pb::ErrorDetail::new("not_ready", true));
}

#[test]
fn enum_values_carry_their_prefixes_and_numbers() {
    assert_eq!(pb::FileOperation::Grep as i32, 11);
    assert_eq!(pb::FileOperation::Grep.as_str_name(), "FILE_OPERATION_GREP");
    assert_eq!(pb::CommandState::FenceUnknown as i32, 5);
    assert_eq!(
        pb::CommandState::FenceUnknown.as_str_name(),
        "COMMAND_STATE_FENCE_UNKNOWN"
    );
}

#[test]
fn the_descriptor_set_registers_with_grpc_reflection() {
    let built = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .with_service_name(SERVICE_NAME)
        .build_v1();
    assert!(built.is_ok(), "reflection rejects the descriptor set");
}

#[test]
fn catalogue_extensions_iterate_in_key_order() {
    let mut item = pb::TemplateCatalogItem::default();
    item.extensions.insert("b/key".to_owned(), "2".to_owned());
    item.extensions.insert("a/key".to_owned(), "1".to_owned());
    let keys: Vec<&str> = item.extensions.keys().map(String::as_str).collect();
    assert_eq!(keys, ["a/key", "b/key"]);
}
