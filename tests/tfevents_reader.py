#!/usr/bin/python3
"""An independent reader of TensorBoard event files for trackers_test: TFRecord framing and CRC32C
written here from the format's description, and the Event messages declared here with Python's
protobuf descriptors (not from the writer's .proto). Prints one JSON object per record:
{"step", "file_version", "values": {tag: value}, "plugins": {tag: plugin}}. Exits 1 on a bad CRC,
a truncated record or an unparsable message.
Usage: tfevents_reader.py FILE"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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


def event_class():
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
    message("Plugin", [("plugin_name", 1, F.TYPE_STRING, None, one)])
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
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    descriptor = pool.FindMessageTypeByName("reader.Ev")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def main(path):
    data = open(path, "rb").read()
    Ev = event_class()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            sys.exit("truncated header at byte %d" % at)
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if header_crc != masked(header):
            sys.exit("bad length CRC at byte %d" % at)
        body = data[at + 12:at + 12 + length]
        if len(body) != length or at + 16 + length > len(data):
            sys.exit("truncated record at byte %d" % at)
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if body_crc != masked(body):
            sys.exit("bad data CRC at byte %d" % at)
        at += 16 + length
        event = Ev()
        event.ParseFromString(body)
        print(json.dumps({
            "step": event.step, "wall_time": event.wall_time, "file_version": event.file_version,
            "values": {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")},
            "plugins": {v.tag: v.metadata.plugin_data.plugin_name for v in event.summary.value}}))


if __name__ == "__main__":
    main(sys.argv[1])
