#!/usr/bin/env python3
"""How big ferry's pieces are: the largest source files, the classes with the most methods and
data members, and the longest functions (with libclang: pip install libclang), plus the lines of
the docs. The bounds the project keeps (docs/ARCHITECTURE.md): no class over ~40 methods, no
source file over ~600 lines.

    python3 bench/code_metrics.py [BUILD_DIR]   # BUILD_DIR has compile_commands.json (build/)
"""
import json
import os
import subprocess
import sys

import clang.cindex as ci

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, "build")
    commands = json.load(open(os.path.join(build, "compile_commands.json")))
    sources = sorted({c["file"] for c in commands
                      if c["file"].startswith(os.path.join(TOP, "src")) and c["file"].endswith(".cpp")})
    files = []
    for root in ("src", "tools", "include"):
        for directory, _, names in os.walk(os.path.join(TOP, root)):
            for name in names:
                if name.endswith((".cpp", ".hpp", ".cu", ".h")):
                    path = os.path.join(directory, name)
                    files.append((sum(1 for _ in open(path)), os.path.relpath(path, TOP)))
    files.sort(reverse=True)
    print("largest source files (lines):")
    for lines, path in files[:8]:
        print("  %5d %s" % (lines, path))
    print("  files over 600 lines: %d" % sum(1 for lines, _ in files if lines > 600))

    classes = {}  # qualified name -> [methods, fields]
    functions = {}  # (file, line) -> (lines, name)
    # libclang does not know the compiler's own header directories: ask the compiler.
    probe = subprocess.run(["c++", "-E", "-x", "c++", "-", "-v"], input="", capture_output=True,
                           text=True).stderr.splitlines()
    start = probe.index("#include <...> search starts here:") + 1
    system = []
    for line in probe[start:]:
        if not line.startswith(" "):
            break
        system += ["-isystem", line.strip()]
    index = ci.Index.create()
    for source in sources:
        command = next(c for c in commands if c["file"] == source)
        args = command["command"].split()[1:] if "command" in command else command["arguments"][1:]
        args = [a for a in args if not a.startswith(("-o", "-c")) and not a.endswith((".o", ".cpp"))]
        tu = index.parse(source, args=args + system + ["-std=c++20"])

        def visit(node, scope):
            for child in node.get_children():
                where = child.location.file.name if child.location.file else ""
                if not where.startswith(os.path.join(TOP, "src")):
                    continue
                kind = child.kind
                if kind in (ci.CursorKind.CLASS_DECL, ci.CursorKind.STRUCT_DECL) and child.is_definition():
                    name = scope + child.spelling
                    counts = classes.setdefault(name, [set(), set()])
                    for member in child.get_children():
                        if member.kind in (ci.CursorKind.CXX_METHOD, ci.CursorKind.FUNCTION_TEMPLATE,
                                           ci.CursorKind.CONSTRUCTOR, ci.CursorKind.DESTRUCTOR):
                            counts[0].add(member.displayname)
                        elif member.kind == ci.CursorKind.FIELD_DECL:
                            counts[1].add(member.spelling)
                    visit(child, name + "::")
                elif kind == ci.CursorKind.NAMESPACE:
                    visit(child, scope)
                elif kind in (ci.CursorKind.CXX_METHOD, ci.CursorKind.FUNCTION_DECL,
                              ci.CursorKind.CONSTRUCTOR, ci.CursorKind.FUNCTION_TEMPLATE) and child.is_definition():
                    extent = child.extent
                    lines = extent.end.line - extent.start.line + 1
                    parent = child.semantic_parent.spelling if child.semantic_parent else ""
                    functions[(where, extent.start.line)] = (lines, "%s::%s" % (parent, child.spelling), where)
        visit(tu.cursor, "")
    print("classes with the most methods (methods, data members):")
    ranked = sorted(classes.items(), key=lambda kv: -len(kv[1][0]))
    for name, (methods, fields) in ranked[:8]:
        print("  %4d %4d %s" % (len(methods), len(fields), name))
    print("  classes over 40 methods: %d" % sum(1 for _, (m, _) in classes.items() if len(m) > 40))
    print("longest functions (lines):")
    for lines, name, where in sorted(functions.values(), reverse=True)[:8]:
        print("  %4d %s (%s)" % (lines, name, os.path.relpath(where, TOP)))
    print("docs (lines):")
    for doc in ("docs/ARCHITECTURE.md", "docs/PERFORMANCE.md"):
        path = os.path.join(TOP, doc)
        if os.path.exists(path):
            print("  %5d %s" % (sum(1 for _ in open(path)), doc))


if __name__ == "__main__":
    main()
