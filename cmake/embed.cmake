# ferry_embed(INPUT OUTPUT NAME): writes OUTPUT at configure time, a C++ source whose assembler
# statement includes the bytes of INPUT (.incbin) as the hidden symbol `NAME`, 16-byte aligned,
# followed by a zero byte and by `NAME_end`. It compiles in milliseconds (a byte array of the
# 12 MB fatbin took a minute to write and another to compile). INPUT may not exist yet: what
# compiles OUTPUT must depend on it.
function(ferry_embed input output name)
  file(CONFIGURE OUTPUT "${output}" CONTENT
"// Generated from ${input} by cmake/embed.cmake; do not edit.
__asm__(
    \".pushsection .rodata\\n\"
    \".balign 16\\n\"
    \".globl ${name}\\n\"
    \".hidden ${name}\\n\"
    \".type ${name}, @object\\n\"
    \"${name}:\\n\"
    \".incbin \\\"${input}\\\"\\n\"
    \".size ${name}, . - ${name}\\n\"
    \".globl ${name}_end\\n\"
    \".hidden ${name}_end\\n\"
    \"${name}_end:\\n\"
    \".byte 0\\n\"
    \".popsection\\n\");
")
endfunction()
