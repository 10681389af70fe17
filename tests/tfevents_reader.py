#!/usr/bin/python3
"""An independent reader of TensorBoard event files for trackers_test: TFRecord framing and CRC32C
written here from the format's description, and the Event and hparams messages declared here with
Python's protobuf descriptors (not from the writer's .proto); the hyper-parameter values are parsed
as protobuf's own google.protobuf.Value. Prints one JSON object per record:
{"step", "wall_time", "file_version", "values": {tag: simple_value}, "plugins": {tag: plugin}}, and
for the hparams plugin's session start also "hparams": {name: number or text}, "hparam_kinds":
{name: "number_value" | "string_value" | ...}, "hparams_version" and "start_time_secs".
A record cut off by the end of the file (what a writer killed in the middle of a write leaves) is
not an error: TensorBoard too reads it as not yet written. It is reported as {"truncated_at": byte}
after the whole records. Exits 1 on a bad CRC or an unparsable message.
Usage: tfevents_reader.py FILE"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

F = descriptor_pb2.FieldDescriptorProto


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def message_classes():
    f = descriptor_pb2.FileDescriptorProto(name="reader_event.proto", package="reader", syntax="proto3")

    def message(name, fields, oneofs=()):
        m = f.message_type.add(name=name)
        for oneof in oneofs:
            m.oneof_decl.add(name=oneof)
        for field_name, number, kind, type_name, label, *oneof in fields:
            field = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = ".reader." + type_name
            if oneof:
                field.oneof_index = oneofs.index(oneof[0])

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Plugin", [("plugin_name", 1, F.TYPE_STRING, None, one),
                       ("content", 2, F.TYPE_BYTES, None, one)])
    message("Meta", [("plugin_data", 1, F.TYPE_MESSAGE, "Plugin", one)])
    # simple_value in a oneof, as in the public format, so that a value written as 0 is told apart
    # from one not written at all.
    message("Val", [("tag", 1, F.TYPE_STRING, None, one),
                    ("simple_value", 2, F.TYPE_FLOAT, None, one, "value"),
                    ("metadata", 9, F.TYPE_MESSAGE, "Meta", one)], oneofs=("value",))
    message("Summ", [("value", 1, F.TYPE_MESSAGE, "Val", many)])
    message("Ev", [("wall_time", 1, F.TYPE_DOUBLE, None, one), ("step", 2, F.TYPE_INT64, None, one),
                   ("file_version", 3, F.TYPE_STRING, None, one),
                   ("summary", 5, F.TYPE_MESSAGE, "Summ", one)])
    # A protobuf map is on the wire a repeated (key = 1, value = 2) message; the value is kept as
    # bytes here and parsed as google.protobuf.Value.
    message("HEntry", [("key", 1, F.TYPE_STRING, None, one), ("value", 2, F.TYPE_BYTES, None, one)])
    message("Start", [("hparams", 1, F.TYPE_MESSAGE, "HEntry", many),
                      ("start_time_secs", 5, F.TYPE_DOUBLE, None, one)])
    message("HPluginData", [("version", 1, F.TYPE_INT32, None, one),
                            ("session_start_info", 3, F.TYPE_MESSAGE, "Start", one)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)

    def cls(name):
        descriptor = pool.FindMessageTypeByName("reader." + name)
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(descriptor)
        return message_factory.MessageFactory(pool).GetPrototype(descriptor)

    return cls("Ev"), cls("HPluginData")


def hparams_of(value, HPluginData):
    data = HPluginData.FromString(value.metadata.plugin_data.content)
    if not data.HasField("session_start_info"):
        sys.exit("hparams value %r without a session_start_info" % value.tag)
    out = {"hparams_version": data.version, "start_time_secs": data.session_start_info.start_time_secs,
           "hparams": {}, "hparam_kinds": {}}
    for entry in data.session_start_info.hparams:
        if entry.key in out["hparams"]:
            sys.exit("hparam %r appears twice" % entry.key)
        hparam = struct_pb2.Value.FromString(entry.value)
        kind = hparam.WhichOneof("kind")
        out["hparam_kinds"][entry.key] = kind
        out["hparams"][entry.key] = getattr(hparam, kind) if kind else None
    return out


def main(path):
    data = open(path, "rb").read()
    Ev, HPluginData = message_classes()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            break
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if header_crc != masked(header):
            sys.exit("bad length CRC at byte %d" % at)
        if at + 16 + length > len(data):
            break
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if body_crc != masked(body):
            sys.exit("bad data CRC at byte %d" % at)
        at += 16 + length
        event = Ev.FromString(body)
        record = {
            "step": event.step, "wall_time": event.wall_time, "file_version": event.file_version,
            "values": {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")},
            "plugins": {v.tag: v.metadata.plugin_data.plugin_name for v in event.summary.value}}
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "hparams":
                record.update(hparams_of(v, HPluginData))
        print(json.dumps(record))
    if at < len(data):
        print(json.dumps({"truncated_at": at}))


if __name__ == "__main__":
    main(sys.argv[1])
