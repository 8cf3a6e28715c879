# Writes OUTPUT, a C++ source whose assembler statement includes the bytes of INPUT (.incbin) as
# the hidden symbol `NAME`, 16-byte aligned, followed by a zero byte and by `NAME_end`. It
# compiles in milliseconds (a byte array of the 12 MB fatbin took a minute to write and another
# to compile). The compiled object must be rebuilt when INPUT changes (OBJECT_DEPENDS); the file
# itself names INPUT's size, so it changes too in most cases.
# Run as: cmake -DINPUT=file -DOUTPUT=file.cpp -DNAME=symbol -P embed.cmake
file(SIZE "${INPUT}" bytes)
file(WRITE "${OUTPUT}.new"
  "// Generated from ${INPUT} (${bytes} bytes) by cmake/embed.cmake; do not edit.\n"
  "__asm__(\n"
  "    \".pushsection .rodata\\n\"\n"
  "    \".balign 16\\n\"\n"
  "    \".globl ${NAME}\\n\"\n"
  "    \".hidden ${NAME}\\n\"\n"
  "    \".type ${NAME}, @object\\n\"\n"
  "    \"${NAME}:\\n\"\n"
  "    \".incbin \\\"${INPUT}\\\"\\n\"\n"
  "    \".size ${NAME}, . - ${NAME}\\n\"\n"
  "    \".globl ${NAME}_end\\n\"\n"
  "    \".hidden ${NAME}_end\\n\"\n"
  "    \"${NAME}_end:\\n\"\n"
  "    \".byte 0\\n\"\n"
  "    \".popsection\\n\");\n")
file(COPY_FILE "${OUTPUT}.new" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.new")
