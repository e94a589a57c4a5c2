/* web.S: the chat page (serve/web/index.html) built into the binary as td_web_page ..
 * td_web_page_end, served at / by server.c. The Makefile rebuilds this when the page changes. */
    .section .rodata
    .globl td_web_page
    .globl td_web_page_end
td_web_page:
    .incbin "serve/web/index.html"
td_web_page_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
